"""Several hosts, one program: `jax.distributed` start-up, global input arrays, and the leader/follower loop.

A multi-host TPU slice (v5e-16: 4 hosts x 4 chips) runs JAX's multi-controller runtime: every host runs this same
program on one global mesh, and every compiled call must be entered by every process. So:

    cluster = start(options)              # jax.distributed.initialize(), before anything else touches JAX
    generator = Generator.from_pretrained(...); generator.warmup()    # every process, same program
    if not cluster.is_leader:
        sys.exit(cluster.follow(generator))   # wait for requests from process 0, run them, exit on STOP
    generator = cluster.lead(generator)   # process 0: validates, publishes each request, then runs it too
    ...
    cluster.stop()                        # STOP to the followers, then leave the cluster

Requests travel through the coordinator's key-value store (part of `jax.distributed`, served by process 0), not a
device collective: an idle follower waits on a key with a short timeout and loops, so no collective is ever left
pending while the page is idle. The leader checks a request with the engine's own rules before publishing it, so a
bad input can never reach one process and not another. Stop is one decision per step: before each step the leader
publishes "go" or "stop" under that step's key and every follower waits for it, so all processes stop at the same
step (the followers wait while their devices still run the step before, so the wait costs nothing).

Faults are bounded by our own deadlines, which fire before JAX's (JAX aborts with a C++ stack trace): every follower
touches a heartbeat key each second; a follower silent for `heartbeat_s`, a slice that does not assemble within
`timeout_s`, or a call that takes longer than `timeout_s` makes the leader log one line and exit with status 4.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.experimental import multihost_utils

from .loop import Stopped
from .samplers import sampler_id
from .validation import InvalidInput, check_guidance, check_shape, check_steps, clean_text, resolve_seed

logger = logging.getLogger(__name__)

#: Exit status of a process that gave up on the cluster (a peer died, never joined, or a call overran).
EXIT_CLUSTER_FAILED = 4

ENV_DISTRIBUTED = "SDXL_DISTRIBUTED"
ENV_COORDINATOR = "SDXL_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "SDXL_NUM_PROCESSES"
ENV_PROCESS_ID = "SDXL_PROCESS_ID"
ENV_TIMEOUT = "SDXL_CLUSTER_TIMEOUT"
ENV_HEARTBEAT = "SDXL_HEARTBEAT_TIMEOUT"

_REQUEST_KEY = "sdxl/request/{}"
_STEP_KEY = "sdxl/step/{}/{}"  # request n, step i: "go" or "stop", the leader's decision every process follows
_STEP_DIR = "sdxl/step/{}"
_HEARTBEAT_KEY = "sdxl/heartbeat/{}"
_POLL_MS = 1000  # how long a follower's wait on the next request blocks before it loops
_gathers = itertools.count()  # every process gathers in the same order, so the n-th barrier is the same everywhere
_barrier_timeout_s = 300.0  # set by start() from --cluster-timeout


@dataclass(frozen=True)
class ClusterOptions:
    """How this process joins a multi-process run (all None/False: a single process, no jax.distributed)."""

    coordinator_address: str | None = None  # HOST:PORT where process 0 serves the coordinator
    num_processes: int | None = None  # processes in the run (hosts of the slice)
    process_id: int | None = None  # this process, 0 .. num_processes - 1; 0 is the leader
    auto: bool = False  # --distributed: let JAX read the cluster from its environment (TPU metadata, SLURM, MPI)
    timeout_s: float = 300.0  # deadline for the slice to assemble and for each request on it
    heartbeat_s: float = 30.0  # a follower silent this long is taken for dead

    @property
    def explicit(self) -> bool:
        return self.coordinator_address is not None


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-host flags, shared by app.py and the CLI; each falls back to its environment variable."""
    group = parser.add_argument_group("multi-host (jax.distributed)")
    add = group.add_argument
    add(
        "--distributed",
        action="store_true",
        default=(_env(ENV_DISTRIBUTED) or "0").lower() in ("1", "true", "yes"),
        help="join a multi-host run detected by JAX (Cloud TPU slice, SLURM, Open MPI); automatic where the "
        f"environment names several processes [{ENV_DISTRIBUTED}=1]",
    )
    add(
        "--coordinator-address",
        metavar="HOST:PORT",
        default=_env(ENV_COORDINATOR),
        help=f"address of process 0, reachable from every process [{ENV_COORDINATOR}]",
    )
    add("--num-processes", type=int, default=_env(ENV_NUM_PROCESSES), help=f"[{ENV_NUM_PROCESSES}]")
    add("--process-id", type=int, default=_env(ENV_PROCESS_ID), help=f"0 serves the page [{ENV_PROCESS_ID}]")
    add(
        "--cluster-timeout",
        type=float,
        default=float(_env(ENV_TIMEOUT) or 300),
        help=f"seconds for all processes to join, and per request [{ENV_TIMEOUT}; default 300]",
    )
    add(
        "--heartbeat-timeout",
        type=float,
        default=float(_env(ENV_HEARTBEAT) or 30),
        help=f"seconds of silence after which a process is taken for dead [{ENV_HEARTBEAT}; default 30]",
    )


def options_from_args(args: argparse.Namespace) -> ClusterOptions:
    """Check the multi-host flags (all three explicit ones, or none of them)."""
    explicit = (args.coordinator_address, args.num_processes, args.process_id)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise InvalidInput("--coordinator-address, --num-processes and --process-id go together; give all three.")
    if args.coordinator_address is not None:
        host, _, port = str(args.coordinator_address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"--coordinator-address must be HOST:PORT; got {args.coordinator_address!r}.")
        if int(args.num_processes) < 1 or not 0 <= int(args.process_id) < int(args.num_processes):
            raise InvalidInput(
                f"--process-id must be in 0..{int(args.num_processes) - 1} and --num-processes at least 1; "
                f"got {args.process_id} of {args.num_processes}."
            )
    if args.cluster_timeout <= 0 or args.heartbeat_timeout <= 0:
        raise InvalidInput("--cluster-timeout and --heartbeat-timeout must be positive.")
    return ClusterOptions(
        coordinator_address=args.coordinator_address,
        num_processes=None if args.num_processes is None else int(args.num_processes),
        process_id=None if args.process_id is None else int(args.process_id),
        auto=bool(args.distributed),
        timeout_s=float(args.cluster_timeout),
        heartbeat_s=float(args.heartbeat_timeout),
    )


def detected_cluster() -> str | None:
    """Name of a multi-process environment JAX would initialise from, read cheaply from env vars (else None).

    Cloud TPU VMs created with `gcloud` carry their worker list in metadata, not the environment: pass
    --distributed there (it is one flag on every worker).
    """
    hosts = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
    if hosts and len(hosts.split(",")) > 1:
        return "TPU slice (TPU_WORKER_HOSTNAMES)"
    if "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in os.environ and int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return "Open MPI"
    return None


def _fatal(message: str) -> None:
    """One line on stderr, then leave at once: no atexit (JAX's shutdown barrier would wait on the dead peer)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    logger.error(message)
    os._exit(EXIT_CLUSTER_FAILED)


class _Deadline:
    """Exits the process with one line when a block overruns: a collective stuck on a dead peer never returns."""

    def __init__(self, seconds: float, message: Callable[[], str]):
        self._timer = threading.Timer(seconds, lambda: _fatal(message()))
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


# ---- global arrays --------------------------------------------------------------------------------------------


def global_batch(arrays: Sequence[np.ndarray], sharding: jax.sharding.Sharding) -> tuple[jax.Array, ...]:
    """Host arrays holding the whole batch (the same on every process) -> global arrays split over `sharding`.

    Each process fills only the shards on its own devices; `device_put` would need every device to be local.
    """
    if jax.process_count() == 1:
        return tuple(jax.device_put(tuple(arrays), sharding))
    return tuple(jax.make_array_from_callback(a.shape, sharding, lambda index, a=a: a[index]) for a in arrays)


def to_host(array: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-process) array on this host; every process must call it (a collective)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    # Meet first: gloo gives a late peer only 30 s to join a collective, and one process may still be compiling
    # (the generate program itself has no cross-process collective, so processes drift apart until here).
    client = jax._src.distributed.global_state.client
    client.wait_at_barrier(f"sdxl/gather/{next(_gathers)}", int(_barrier_timeout_s * 1000))
    return multihost_utils.process_allgather(array, tiled=True)


# ---- start-up ---------------------------------------------------------------------------------------------------


class Cluster:
    """This process's place in the run: index, count, and the request channel between leader and followers."""

    def __init__(self, options: ClusterOptions):
        self.options = options
        self.process_index = jax.process_index()
        self.process_count = jax.process_count()
        self._client = jax._src.distributed.global_state.client if self.process_count > 1 else None
        self._requests = 0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        if self._client is not None:
            target = self._watch_followers if self.is_leader else self._beat
            self._watcher = threading.Thread(target=target, name="sdxl-cluster", daemon=True)
            self._watcher.start()

    @property
    def is_leader(self) -> bool:
        return self.process_index == 0

    @property
    def distributed(self) -> bool:
        return self.process_count > 1

    def describe(self) -> str:
        return f"process {self.process_index} of {self.process_count}"

    # -- liveness

    def _beat(self) -> None:
        """Follower: touch our heartbeat key every second, so the leader can tell silence from slowness."""
        beat = 0
        while not self._stopped.wait(1.0):
            beat += 1
            try:
                self._client.key_value_set(_HEARTBEAT_KEY.format(self.process_index), str(beat), allow_overwrite=True)
            except Exception:  # the coordinator (process 0) is gone: the request loop reports it
                return

    def _watch_followers(self) -> None:
        """Leader: exit with one line when a follower's heartbeat stops for heartbeat_s."""
        last: dict[int, tuple[str | None, float]] = {}
        started = time.monotonic()
        while not self._stopped.wait(1.0):
            now = time.monotonic()
            for process in range(1, self.process_count):
                try:
                    value = self._client.key_value_try_get(_HEARTBEAT_KEY.format(process))
                except Exception:
                    value = None  # not beating yet
                seen, since = last.get(process, (None, started))
                if value != seen:
                    last[process] = (value, now)
                elif now - since > self.options.heartbeat_s and not self._stopped.is_set():
                    _fatal(
                        f"process {process} of {self.process_count} stopped answering "
                        f"(no heartbeat for {now - since:.0f} s); it died or its host is unreachable. Stopping."
                    )

    # -- leader

    def lead(self, generator):
        """The generator process 0 serves with: itself on one process, a broadcasting wrapper on several."""
        return _Leader(generator, self) if self.distributed else generator

    def publish(self, request: dict) -> None:
        """Leader: hand one request (or STOP) to every follower."""
        if self._client is None:
            return
        self._requests += 1
        self._client.key_value_set(_REQUEST_KEY.format(self._requests), json.dumps(request))
        if self._requests > 2:  # every follower has finished request n-2 (request n-1 needed them all)
            for old in (_REQUEST_KEY.format(self._requests - 2), _STEP_DIR.format(self._requests - 2)):
                try:
                    self._client.key_value_delete(old)  # a directory key takes every step key under it
                except Exception:
                    logger.debug("could not delete an old request key", exc_info=True)

    def decide(self, request: int, step: int, stop: bool) -> bool:
        """Leader: publish whether request `request` stops before `step`; returns the decision."""
        if self._client is not None:
            self._client.key_value_set(_STEP_KEY.format(request, step), "stop" if stop else "go")
        return stop

    def follow_decision(self, request: int, step: int) -> bool:
        """Follower: the leader's decision for `step` of request `request` (True = stop)."""
        try:
            return self._wait(_STEP_KEY.format(request, step)) == "stop"
        except ConnectionError as exc:
            _fatal(f"{self.describe()}: lost process 0 ({exc}). Stopping.")

    def stop(self) -> None:
        """Leader: STOP every follower and leave the cluster; followers: leave. Idempotent."""
        if self._stopped.is_set():
            return
        if self._client is not None and self.is_leader:
            with self._lock:
                self.publish({"command": "stop"})
        self._stopped.set()
        if self._client is not None:
            with _Deadline(self.options.timeout_s, lambda: "the other processes did not shut down in time."):
                jax.distributed.shutdown()  # a barrier: waits until every follower has read STOP and left

    # -- follower

    def follow(self, generator, *, json_summary: bool = False) -> int:
        """Follower: run every request process 0 publishes, in order, until STOP. Returns an exit status."""
        compiles_at_start = generator.compile_count
        served = 0
        number = 0
        logger.info("%s: following process 0", self.describe())
        while True:
            number += 1
            try:
                text = self._wait(_REQUEST_KEY.format(number))
            except ConnectionError as exc:
                _fatal(f"{self.describe()}: lost process 0 ({exc}). Stopping.")
            request = json.loads(text)
            if request.get("command") == "stop":
                break
            try:
                generator.generate(
                    request["prompt"],
                    negative_prompt=request["negative_prompt"],
                    seed=request["seed"],
                    guidance_scale=request["guidance_scale"],
                    size=tuple(request["size"]),
                    steps=request["steps"],
                    sampler=request["sampler"],
                    gate=lambda step, _wants, n=number: self.follow_decision(n, step),
                )
            except Stopped as stopped:  # the leader stopped it at this same step
                print(f"{self.describe()}: request {number} {stopped}, as process 0 decided", file=sys.stderr,
                      flush=True)  # fmt: skip
            except Exception as exc:  # the leader is now blocked in the same call: make it give up, loudly
                logger.exception("request %d failed", number)
                _fatal(f"{self.describe()}: request {number} failed ({exc}); the cluster cannot continue.")
            served += 1
        recompiles = generator.compile_count - compiles_at_start
        summary = {"process": self.process_index, "requests": served, "compiles_after_warmup": recompiles}
        if json_summary:
            print(json.dumps(summary), flush=True)
        print(
            f"{self.describe()}: served {served} request(s), {recompiles} compile(s) after warm-up; stopping.",
            file=sys.stderr,
            flush=True,
        )
        self.stop()
        return 0

    def _wait(self, key: str) -> str:
        """Block until the leader publishes `key`, looping on short timeouts (an idle page may be idle for days)."""
        while True:
            try:
                return self._client.blocking_key_value_get(key, _POLL_MS)
            except Exception as exc:
                if "DEADLINE_EXCEEDED" in str(exc) or "Deadline Exceeded" in str(exc):
                    continue
                raise ConnectionError(str(exc).splitlines()[0]) from None


class _Leader:
    """Process 0's generator: checks a request, publishes it to the followers, then runs it alongside them."""

    def __init__(self, generator, cluster: Cluster):
        self._generator = generator
        self._cluster = cluster

    def __getattr__(self, name: str):  # config, num_images, device_summary, compile_count, load_timings, ...
        return getattr(self._generator, name)

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str = "",
        seed: int = 0,
        guidance_scale: float = 5.0,
        size: tuple[int, int] | None = None,
        steps: int | None = None,
        sampler: str | None = None,
        progress=None,
        should_stop=None,
    ):
        """Publish, then run; `progress` and `should_stop` stay on process 0, which decides each step for all."""
        from .generator import STYLED_MAX_CHARS  # the engine's own limits: a request it would refuse is never sent

        generator = self._generator
        height, width = size or generator.sizes[0]
        check_shape(height, width, generator.sizes)
        request = {
            "command": "generate",
            "prompt": clean_text(prompt, field="prompt", max_chars=STYLED_MAX_CHARS),
            "negative_prompt": clean_text(negative_prompt, field="negative prompt", max_chars=STYLED_MAX_CHARS),
            "seed": resolve_seed(seed),
            "guidance_scale": check_guidance(guidance_scale),
            "size": [int(height), int(width)],
            "steps": check_steps(generator.config.steps if steps is None else steps),
            "sampler": sampler_id(generator.sampler.sampler if sampler is None else sampler),
        }
        cluster = self._cluster
        with cluster._lock:  # one request at a time, in the order published
            if cluster._stopped.is_set():
                raise RuntimeError("the cluster is shutting down")
            cluster.publish(request)
            number = cluster._requests
            with _Deadline(
                cluster.options.timeout_s,
                lambda: f"request {number} did not finish within {cluster.options.timeout_s:g} s on "
                f"{cluster.process_count} processes; a process is stuck or unreachable. Stopping.",
            ):
                try:
                    return self._generator.generate(
                        request["prompt"],
                        negative_prompt=request["negative_prompt"],
                        seed=request["seed"],
                        guidance_scale=request["guidance_scale"],
                        size=(height, width),
                        steps=request["steps"],
                        sampler=request["sampler"],
                        progress=progress,
                        should_stop=should_stop,
                        gate=lambda step, wants_stop: cluster.decide(number, step, wants_stop),
                    )
                except (InvalidInput, Stopped):
                    raise  # InvalidInput cannot happen after the checks above; Stopped: every process stopped alike
                except Exception as exc:
                    # A collective failed (a peer died mid-request): the slice is unusable. Answer this request
                    # with an error, then leave with one line (the followers see the coordinator go and exit too).
                    reason = str(exc).strip().splitlines()[0][:300]
                    message = f"request {number} failed across the processes ({reason}). Stopping."
                    threading.Timer(1.0, lambda: _fatal(message)).start()
                    raise RuntimeError(message) from None


def start(options: ClusterOptions) -> Cluster:
    """Join the run `options` (or the environment) describe; a single process when neither asks for more.

    Must run before anything initialises a JAX backend (jax.devices(), device_put, any computation).
    """
    detected = detected_cluster()
    if not (options.explicit or options.auto or detected):
        return Cluster(options)
    global _barrier_timeout_s
    _barrier_timeout_s = options.timeout_s
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU runs (tests); TPU/GPU use their own
    where = options.coordinator_address or detected or "the environment"
    logger.info("joining a multi-process run (%s)", where)
    timeout = options.timeout_s
    started = time.perf_counter()
    with _Deadline(
        timeout,
        lambda: f"not every process joined within {timeout:g} s (coordinator {where}); "
        "check that the same command runs on every host and that the coordinator port is reachable.",
    ):
        try:
            jax.distributed.initialize(
                coordinator_address=options.coordinator_address,
                num_processes=options.num_processes,
                process_id=options.process_id,
                # JAX's own limits sit behind ours, so our one-line messages win the race against its abort.
                initialization_timeout=int(timeout) + 30,
                heartbeat_timeout_seconds=int(3 * options.heartbeat_s) + 10,
                shutdown_timeout_seconds=int(timeout),
            )
        except (RuntimeError, ValueError) as exc:
            raise InvalidInput(f"could not join the multi-process run: {str(exc).splitlines()[0]}") from None
    cluster = Cluster(options)
    # Printed, not logged: the CLI logs warnings only, and this line tells each host's operator the slice is up.
    print(
        f"{cluster.describe()} joined in {time.perf_counter() - started:.1f} s: "
        f"{jax.device_count()} devices in all, {jax.local_device_count()} here",
        file=sys.stderr,
        flush=True,
    )
    return cluster
