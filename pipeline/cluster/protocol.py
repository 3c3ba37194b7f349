"""The leader/follower protocol: every process of a multi-host run makes the same compiled calls, in the same order.

A multi-host TPU slice (v5e-16: 4 hosts x 4 chips) runs JAX's multi-controller runtime: every host runs this same
program on one global mesh, and every compiled call must be entered by every process. So:

    cluster = start(options)              # cluster/join.py: jax.distributed.initialize(), before JAX starts
    generator = Generator.load(config); generator.warmup()    # every process, same programs
    if not cluster.is_leader:
        sys.exit(cluster.follow(generator))   # wait for requests from process 0, run them, exit on STOP
    engine = cluster.lead(generator)      # process 0: publishes each checked request, then runs it too
    engine.generate(request, on_step, should_stop)
    cluster.stop()                        # STOP to the followers, then leave the cluster

Requests travel through the coordinator's key-value store (part of `jax.distributed`, served by process 0), not a
device collective: an idle follower waits on a key with a short timeout and loops, so no collective is ever left
pending while the page is idle. A request is checked where it enters (`request.parse_request`) and travels as data
(`Request.to_dict`), so a bad input can never reach one process and not another, and no process checks it twice.
Stop is one decision per step: before each step the leader
publishes "go" or "stop" under that step's key and every follower waits for it, so all processes stop at the same
step (the followers wait while their devices still run the step before, so the wait costs nothing).

Faults are bounded by our own deadlines, which fire before JAX's (JAX aborts with a C++ stack trace): every follower
touches a heartbeat key each second; a follower silent for `heartbeat_s`, a slice that does not assemble within
`timeout_s`, or a call that takes longer than `timeout_s` makes the leader log one line and exit with status 4.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator

import jax

from ..contract.request import Request
from ..contract.stopping import Stopped
from ..device.sharding import coordinator_client
from ..host.loop import follows_steps, ignore_preview, ignore_step
from .faults import Deadline, fatal
from .join_options import ClusterOptions

logger = logging.getLogger(__name__)

_REQUEST_KEY = "sdxl/request/{}"
_STEP_KEY = "sdxl/step/{}/{}"  # request n, step i: "go" or "stop", the leader's decision every process follows
_STEP_DIR = "sdxl/step/{}"
_HEARTBEAT_KEY = "sdxl/heartbeat/{}"
_POLL_MS = 1000  # how long a follower's wait on the next request blocks before it loops


class Cluster:
    """This process's place in the run: index, count, and the request channel between leader and followers."""

    def __init__(self, options: ClusterOptions):
        self.options = options
        self.process_index = jax.process_index()
        self.process_count = jax.process_count()
        self._client = coordinator_client() if self.process_count > 1 else None
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
                    fatal(
                        f"process {process} of {self.process_count} stopped answering "
                        f"(no heartbeat for {now - since:.0f} s); it died or its host is unreachable. Stopping."
                    )

    @contextlib.contextmanager
    def failed_calls_as_one_line(self) -> Iterator[None]:
        """Around work every process does together at start-up (loading, placing, compiling). A follower killed while
        the leader places its weights makes that call across the processes (a gloo allgather) fail at once, and the
        error would come out as a traceback beside the watcher's line. So on the leader of several processes a JAX
        runtime error first waits for the heartbeat watcher, whose one line (and status 4) ends the process when a
        follower is gone; any other error (out of memory, say) is raised as it is once the wait shows them alive."""
        try:
            yield
        except jax.errors.JaxRuntimeError:
            if self.distributed and self.is_leader:
                logger.debug("a call at start-up failed; waiting for the followers' heartbeats", exc_info=True)
                time.sleep(self.options.heartbeat_s + 2)  # the watcher's fatal() ends the process when one is silent
            raise

    # -- leader

    def lead(self, generator):
        """The engine process 0 serves with: the generator itself on one process; on several, one that publishes
        each request before it runs it (`LeadingGenerator`)."""
        return LeadingGenerator(generator, self) if self.distributed else generator

    def publish(self, message: dict) -> int:
        """Leader: hand one message (a request, or STOP) to every follower, in order; its number."""
        with self._lock:
            if self._stopped.is_set():
                raise RuntimeError("the cluster is shutting down")
            self._requests += 1
            number = self._requests
            if self._client is None:
                return number
            self._client.key_value_set(_REQUEST_KEY.format(number), json.dumps(message))
            if number > 2:  # every follower has finished request n-2 (request n-1 needed them all)
                for old in (_REQUEST_KEY.format(number - 2), _STEP_DIR.format(number - 2)):
                    try:
                        self._client.key_value_delete(old)  # a directory key takes every step key under it
                    except Exception:
                        logger.debug("could not delete an old request key", exc_info=True)
            return number

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
            fatal(f"{self.describe()}: lost process 0 ({exc}). Stopping.")

    def stop(self) -> None:
        """Leader: STOP every follower and leave the cluster; followers: leave. Idempotent."""
        if self._stopped.is_set():
            return
        if self._client is not None and self.is_leader:
            self.publish({"command": "stop"})
        self._stopped.set()
        if self._client is not None:
            with Deadline(self.options.timeout_s, lambda: "the other processes did not shut down in time."):
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
                fatal(f"{self.describe()}: lost process 0 ({exc}). Stopping.")
            request = json.loads(text)
            if request.get("command") == "stop":
                break
            try:
                generator.generate(
                    Request.from_dict(request["request"]),
                    gate=lambda step, _wants, n=number: self.follow_decision(n, step),
                    on_preview=ignore_preview if request.get("previews") else None,  # the leader's programs
                    on_step=ignore_step if request.get("stepwise") else None,  # the leader's calls
                )
            except Stopped as stopped:  # the leader stopped it at this same step
                print(
                    f"{self.describe()}: request {number} {stopped}, as process 0 decided", file=sys.stderr, flush=True
                )
            except Exception as exc:  # the leader is now blocked in the same call: make it give up, loudly
                logger.exception("request %d failed", number)
                fatal(f"{self.describe()}: request {number} failed ({exc}); the cluster cannot continue.")
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


class LeadingGenerator:
    """Process 0's engine on several processes: publishes each request to the followers, then runs it with them.

    Everything else (config, rules, sizes, device_summary, ...) is the generator's own.
    """

    def __init__(self, generator, cluster: Cluster):
        self._generator = generator
        self._cluster = cluster
        self._lock = threading.Lock()  # one request at a time, in the order published

    def __getattr__(self, name: str):
        return getattr(self._generator, name)

    def generate(self, request: Request, on_step=None, should_stop=None, on_preview=None):
        """Publish, then run; `on_step`, `should_stop` and `on_preview` stay on process 0, which decides each step for
        all (its previews show process 0's images: the others' rows stay where they are)."""
        cluster = self._cluster
        with self._lock:
            number = cluster.publish(
                {
                    "command": "generate",
                    "request": request.to_dict(),
                    "previews": on_preview is not None,
                    # the followers make the same calls: a step per call when somebody follows the steps here
                    "stepwise": follows_steps(on_step, should_stop, on_preview),
                }
            )
            with Deadline(
                cluster.options.timeout_s,
                lambda: (
                    f"request {number} did not finish within {cluster.options.timeout_s:g} s on "
                    f"{cluster.process_count} processes; a process is stuck or unreachable. Stopping."
                ),
            ):
                try:
                    return self._generator.generate(
                        request,
                        on_step,
                        should_stop,
                        gate=lambda step, wants: cluster.decide(number, step, wants),
                        on_preview=on_preview,
                    )
                except Stopped:
                    raise  # every process stopped at the same step
                except Exception as exc:
                    # A collective failed (a peer died mid-request): the slice is unusable. Answer this request
                    # with an error, then leave with one line (the followers see the coordinator go and exit too).
                    reason = str(exc).strip().splitlines()[0][:300]
                    message = f"request {number} failed across the processes ({reason}). Stopping."
                    threading.Timer(1.0, lambda: fatal(message)).start()
                    raise RuntimeError(message) from None
