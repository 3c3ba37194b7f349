"""The denoising loop on the host: what it costs per step, what Stop frees, and a restart on a warm cache.

    python -m bench --only hostloop     # ms per step: host loop vs the fused fori_loop program (interleaved)
    python -m bench --only stop         # job.cancel() at step 2 of 100 -> the next request's first step
    python -m bench --only samplers     # compilations over steps 1..50 x the four samplers (must be 0)
    python -m bench --only sizes        # app start-up, 3 sizes, progress on: cold vs warm compilation cache

The fused program is the engine as it served before the host loop (text -> `fori_loop` over the steps -> VAE in
one program, `bench/cpu/fused.generate_local`); it is compiled here for the same size and steps, so both run the same
network on the same devices. Per-step cost = (call seconds - the same call at 1 step) / (steps - 1), so text
encoding and VAE decode cancel out.
"""

from __future__ import annotations

import functools
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..common import Progress, Stats, progress
from ..engine import FIELD, KINDS
from .startup import app_phases, app_ready

PROMPT = "a photo of an astronaut riding a horse on the moon"
TARGET_HOST_LOOP = 0.03  # host loop at most 3 % slower per step than the fused loop
TARGET_WARM_COMPILE = 0.25  # warm start: XLA compile seconds at most 25 % of the cold start's
TARGET_STOP_STEPS = 2.0  # cancel -> next request's first step within 2 step times


# ---- host loop vs fused loop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostLoopCost:
    """Seconds per denoising step: the host loop (one compiled step per step) vs one fused fori_loop program."""

    size: str  # width×height
    steps: int  # steps per timed call
    devices: int  # devices (one image each)
    host_loop_call: Stats  # Generator.generate device seconds (encode + steps + decode, dispatched a step ahead)
    fused_call: Stats  # the fused program, same inputs
    host_loop_step_ms: float  # median per-step ms: (call - 1-step call) / (steps - 1)
    fused_step_ms: float
    difference: float  # host / fused per-step - 1
    target: float
    meets_target: bool
    compiles_while_timing: int  # XLA compilations during the timed calls (must be 0)


def fused_program(generator, steps: int):
    """The engine's pre-host-loop program for its first size: jit(shard_map(generate_local)), Euler, compiled."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from bench.cpu.fused import generate_local

    from ..engine import DATA_AXIS, batch_sharded, hooked

    height, width = generator.sizes[0]
    local = functools.partial(
        generate_local, generator.programs.modules, height=height, width=width, steps=steps, sampler=generator.sampler
    )
    batch = P(DATA_AXIS)
    program = jax.jit(
        jax.shard_map(
            hooked(local, generator.config.attention),
            mesh=generator.mesh,
            in_specs=(P(), batch, batch, batch, batch, batch),
            out_specs=batch,
            check_vma=False,
        )
    )
    n, sharding = generator.num_images, batch_sharded(generator.mesh)
    params = generator._params
    abstract = [jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)]
    for shape, dtype in (
        ((n, 2, 77), np.int32),
        ((n, 2, 77), np.int32),
        ((n,), np.bool_),
        ((n,), np.float32),
        ((n,), np.uint32),
    ):
        abstract.append(jax.ShapeDtypeStruct(shape, dtype, sharding=sharding))
    compiled = program.lower(*abstract).compile()
    tokens = np.zeros((n, 2, 77), np.int32)
    inputs = jax.device_put(
        (tokens, tokens, np.zeros(n, bool), np.full(n, 5.0, np.float32), np.arange(n, dtype=np.uint32)), sharding
    )

    def call() -> float:
        started = time.perf_counter()
        np.asarray(compiled(params, *inputs))  # uint8 images back on the host, as the engine does
        return time.perf_counter() - started

    return call


def host_loop_cost(generator, steps: int, runs: int, say: Progress = progress) -> HostLoopCost:
    """Interleaved calls of both at `steps` and at 1 step; medians; Euler on the engine's first size."""
    fused = {n: fused_program(generator, n) for n in (1, steps)}
    for call in fused.values():
        call()  # first run, untimed
    sampler = "Euler"

    def host(n: int) -> float:
        result = generator.generate(generator.request(PROMPT, seed=0, steps=n, sampler=sampler))
        return result.timings["device_s"]

    host(steps), host(1)
    before = generator.compile_count
    times: dict[str, list[float]] = {"host": [], "host1": [], "fused": [], "fused1": []}
    for _ in range(runs):
        times["host"].append(host(steps))
        times["fused"].append(fused[steps]())
        times["host1"].append(host(1))
        times["fused1"].append(fused[1]())
    compiles = generator.compile_count - before
    stats = {name: Stats.of(values) for name, values in times.items()}
    host_ms = (stats["host"].median - stats["host1"].median) / (steps - 1) * 1000
    fused_ms = (stats["fused"].median - stats["fused1"].median) / (steps - 1) * 1000
    difference = host_ms / fused_ms - 1
    height, width = generator.sizes[0]
    say(
        f"host loop: {host_ms:.1f} ms per step vs fused {fused_ms:.1f} ms ({difference:+.1%}), "
        f"{width}×{height}, {steps} steps, {runs} interleaved runs, {compiles} compilations"
    )
    return HostLoopCost(
        f"{width}×{height}",
        steps,
        generator.device_count,
        stats["host"],
        stats["fused"],
        host_ms,
        fused_ms,
        difference,
        TARGET_HOST_LOOP,
        abs(difference) <= TARGET_HOST_LOOP,
        compiles,
    )


# ---- compilations over steps and samplers --------------------------------------------------------------------


@dataclass(frozen=True)
class SamplerSweep:
    requests: int  # requests made: every step count in 1..max_steps with each sampler and schedule type it has
    max_steps: int
    samplers: tuple[str, ...]  # "sampler / schedule type" pairs swept
    compiles_added: int  # XLA compilations during the sweep (must be 0)
    seconds: float
    plan_ms_per_step: dict  # sampler -> host ms per step to compute its plan (25 steps, uncached; median of 20)
    wall_ms_per_row: dict  # sampler -> wall ms per UNet call over its sweep (host + device, this engine's size)


def plan_cost(sampler: str, steps: int = 25, repeats: int = 20) -> float:
    """Host milliseconds per step of computing `sampler`'s plan (its rows), uncached: median of `repeats`."""
    from ..engine import SamplerConfig

    config, times = SamplerConfig(timestep_spacing="leading"), []
    for _ in range(repeats):
        started = time.perf_counter()
        config.plan(steps, sampler)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000 / steps


def sampler_sweep(
    generator, max_steps: int = 50, say: Progress = progress, counts: tuple[int, ...] = ()
) -> SamplerSweep:
    """Every step count 1..max_steps (or `counts`) with every sampler and each of its schedule types, one request
    each; counts compilations, and times each sampler's plan on the host."""
    from ..engine import LCM_MAX_STEPS, sampler_schedules

    pairs = sampler_schedules()
    before, started, requests = generator.compile_count, time.perf_counter(), 0
    wall: dict[str, list[float]] = {}
    for sampler, schedule in pairs:
        sampler_started, rows = time.perf_counter(), 0
        limit = LCM_MAX_STEPS if sampler == "LCM" else max_steps
        for steps in [n for n in counts if n <= limit] if counts else range(1, limit + 1):
            request = generator.request(PROMPT, seed=steps, steps=steps, sampler=sampler, schedule_type=schedule)
            generator.generate(request)
            requests += 1
            rows += 2 * steps - 1 if sampler == "Heun" else steps
        wall.setdefault(sampler, []).append((time.perf_counter() - sampler_started) * 1000 / rows)
        say(f"samplers: {sampler} / {schedule} done, {generator.compile_count - before} compiles so far")
    compiles = generator.compile_count - before
    say(
        f"samplers: {requests} requests (steps 1..{max_steps} x {len(pairs)} sampler/schedule pairs), {compiles} "
        "compiles"
    )
    costs = {name: plan_cost(name) for name in dict(pairs)}
    return SamplerSweep(
        requests,
        max_steps,
        tuple(f"{s} / {t}" for s, t in pairs),
        compiles,
        time.perf_counter() - started,
        costs,
        {name: sorted(v)[len(v) // 2] for name, v in wall.items()},
    )


# ---- Stop -------------------------------------------------------------------------------------------------------

#: Steps of the cancelled request: the most a request may ask for (100), so that a cancel a loaded machine delays
#: still finds it running (at 64×64 on the 2-core VM at load ~10, 50 steps ran out before the cancel reached them).
STOP_STEPS = FIELD["steps"].high
#: Cancelled requests sent per run at most: a try whose request ran to its end anyway measures nothing and is sent
#: again (its reason kept in `StopLatency.missed`).
STOP_TRIES = 3
STOP_WAIT_S = 600  # the longest wait for a request to reach step 2, or for the next request's answer


@dataclass(frozen=True)
class StopLatency:
    """job.cancel() at step 2 of a long request (through gradio_client) -> the devices free -> the next request.

    Moments are taken in the server process (`Generator.recent_runs`): the cancelled request's `freed_at` (its last
    queued step done, nothing of it left on the devices) and the next request's `first_dispatch_at` (its first
    denoising step queued, right behind its text encoding) and `first_step_at` (that step's result ready).
    """

    steps: int  # steps the cancelled request asked for
    cancelled_at_step: int  # the client-side progress when cancel() was called
    engine_stopped_after: int  # steps the engine had dispatched when it stopped (median)
    step_s: Stats  # seconds per step of this server (uncancelled requests)
    cancel_answered: Stats  # seconds: cancel() returns (gradio_client's POST /cancel answered by the server)
    cancel_to_stop_seen: Stats  # seconds: cancel() -> the engine decides to stop (before its next step)
    stop_seen_to_devices_free: Stats  # seconds: the one step it had already queued finishes
    cancel_to_devices_free: Stats  # seconds
    cancel_to_next_first_step_queued: Stats  # seconds
    cancel_to_next_first_step_ready: Stats  # seconds (includes the next request's own text encoding and step)
    in_step_times: float  # median cancel_to_next_first_step_queued / median step time
    target: float
    meets_target: bool
    missed: tuple[str, ...] = ()  # why each try that measured nothing did (sent again); empty on an idle machine


def stop_latency(
    generator, runs: int, steps: int = STOP_STEPS, say: Progress = progress, tries: int = STOP_TRIES
) -> StopLatency:
    """Through a launched app: submit, cancel at step 2, then one more request; timed inside the server process.

    A try whose cancelled request ran to its end measures nothing and is made again, up to `tries` × `runs`
    requests in all; it fails only when none was stopped."""
    from web.options import DEFAULT_QUEUE_SIZE

    from ..serving.app import close_app, launch_app, make_client

    page = launch_app(generator, queue_size=DEFAULT_QUEUE_SIZE)
    moments: dict[str, list[float]] = {
        "answered": [],
        "seen": [],
        "seen_free": [],
        "free": [],
        "queued": [],
        "ready": [],
    }
    step_times, at, dispatched, missed = [], 0, [], []
    try:
        # A client that fetches the previews reads the stream behind its downloads (seconds on a loaded machine), so
        # its cancel could come after the request's end; this one fetches no file.
        client = make_client(page.local_url, download_dir=False)
        while len(dispatched) < runs and len(dispatched) + len(missed) < tries * runs:
            result = generator.generate(generator.request(PROMPT, seed=len(step_times), steps=steps))
            step_times.append((result.timings["device_s"]) / steps)
            outcome = cancel_once(client, generator, steps)
            if isinstance(outcome, str):
                missed.append(outcome)
                say(f"stop: nothing measured, {outcome}; trying again")
                continue
            at = outcome.pop("at")
            dispatched.append(outcome.pop("done"))
            for name, seconds in outcome.items():
                moments[name].append(seconds)
    finally:
        close_app(page)
    if not dispatched:
        raise RuntimeError(
            f"none of {len(missed)} cancelled requests of {steps} steps was stopped: " + "; ".join(sorted(set(missed)))
        )
    step_s = Stats.of(step_times)
    answered, seen, seen_free, free, queued, ready = (
        Stats.of(moments[name]) for name in ("answered", "seen", "seen_free", "free", "queued", "ready")
    )
    ratio = queued.median / step_s.median
    say(
        f"stop: cancel at step {at} -> cancel() answered {answered.median * 1000:.0f} ms -> stop decided "
        f"{seen.median * 1000:.0f} ms -> devices free "
        f"+{seen_free.median * 1000:.0f} ms = {free.median * 1000:.0f} ms; next request's first step queued "
        f"{queued.median * 1000:.0f} ms ({ratio:.2f} step times), ready {ready.median * 1000:.0f} ms; a step "
        f"{step_s.median * 1000:.0f} ms; the engine stopped after {sorted(dispatched)[len(dispatched) // 2]} of "
        f"{steps}; {len(dispatched)} runs measured, {len(missed)} tries missed"
    )
    return StopLatency(
        steps,
        at,
        sorted(dispatched)[len(dispatched) // 2],
        step_s,
        answered,
        seen,
        seen_free,
        free,
        queued,
        ready,
        ratio,
        TARGET_STOP_STEPS,
        ratio <= TARGET_STOP_STEPS,
        tuple(missed),
    )


def cancel_once(client, generator, steps: int) -> dict | str:
    """One request of `steps` cancelled once the client sees its step 2, then a 2-step request: the moments (seconds
    from cancel(), the client's step `at` and the steps the engine had `done`), or why this try measured nothing."""
    job = client.submit(PROMPT, steps=steps, api_name="/generate")
    deadline = time.monotonic() + STOP_WAIT_S
    while True:  # step 2 seen by the client: it knows the job's id (a cancel without one would stop the next request)
        data = job.status().progress_data
        if data and data[0].index is not None and data[0].index >= 2:
            at = data[0].index
            break
        if job.done():
            return "the request ended before the client saw its step 2"
        if time.monotonic() > deadline:
            raise TimeoutError(f"the request to cancel did not reach step 2 in {STOP_WAIT_S} s")
        time.sleep(0.005)
    cancelled = time.perf_counter()
    job.cancel()
    answered = time.perf_counter() - cancelled
    client.submit(PROMPT, steps=2, api_name="/generate").result(timeout=STOP_WAIT_S)  # waits behind the cancelled one
    stopped, follow = list(generator.recent_runs)[-2:]
    if (stopped["steps"], follow["steps"]) != (steps, 2):
        raise RuntimeError(
            f"the engine's last runs were of {stopped['steps']} and {follow['steps']} steps, not "
            f"{steps} and 2: something else ran on it"
        )
    if not stopped["stopped"]:
        return f"the cancelled request ran to its end (the cancel reached the engine after its step {steps})"
    if follow["stopped"]:
        return "the next request was stopped instead (the cancel named no job)"
    return {
        "at": at,
        "done": stopped["done"],
        "answered": answered,
        "seen": stopped["stop_seen_at"] - cancelled,
        "seen_free": stopped["freed_at"] - stopped["stop_seen_at"],
        "free": stopped["freed_at"] - cancelled,
        "queued": follow["first_dispatch_at"] - cancelled,
        "ready": follow["first_step_at"] - cancelled,
    }


# ---- start-up on a warm cache ------------------------------------------------------------------------------------

_COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.]+) sec")
_TRACED = re.compile(r"Finished tracing \S+ for jit in ([0-9.]+) sec")
_LOWERED = re.compile(r"Finished jaxpr to MLIR module conversion \S+ in ([0-9.]+) sec")
_HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")
_MISS = re.compile(r"PERSISTENT COMPILATION CACHE MISS for '([^']+)'")
_NOT_WRITTEN = re.compile(r"Not writing persistent cache entry for '([^']+)'")


@dataclass(frozen=True)
class AppStart:
    """One `python app.py` start until it serves, with JAX_LOG_COMPILES=1; seconds."""

    cache: str  # "cold" (empty compilation cache) or "warm" (filled by the cold start)
    ready_s: float  # launch -> "Running on" (loaded, compiled, warmed up, serving)
    xla_compile_s: float  # sum of "Finished XLA compilation" (compiling, or loading from the cache)
    tracing_s: float  # sum of "Finished tracing"
    lowering_s: float  # sum of "Finished jaxpr to MLIR module conversion"
    programs: int  # XLA compilations logged
    cache_hits: int
    cache_misses: int
    not_cached: int  # "Not writing persistent cache entry" (e.g. host callbacks): must be 0
    served_compile_s: float  # XLA seconds of the served programs alone (encode/start/step/decode)
    served_hits: int  # of the served programs, cache hits
    served_programs: int
    phases: dict  # the app's own phase lines: load, cast, replicate, compile, first run (seconds)


def app_start(args: list[str], cache_dir: Path, cache: str, timeout_s: float = 1200) -> AppStart:
    ready, lines = app_ready(args, cache_dir, timeout_s, extra_env={"JAX_LOG_COMPILES": "1"})
    text = "".join(lines)
    compiled = [(name, float(s)) for name, s in _COMPILED.findall(text)]
    served = [(name, s) for name, s in compiled if _is_served(name)]
    hits = _HIT.findall(text)
    phases = app_phases(text)
    return AppStart(
        cache=cache,
        ready_s=ready,
        xla_compile_s=sum(s for _, s in compiled),
        tracing_s=sum(float(s) for s in _TRACED.findall(text)),
        lowering_s=sum(float(s) for s in _LOWERED.findall(text)),
        programs=len(compiled),
        cache_hits=len(hits),
        cache_misses=len(_MISS.findall(text)),
        not_cached=len(_NOT_WRITTEN.findall(text)),
        served_compile_s=sum(s for _, s in served),
        served_hits=sum(1 for name in hits if _is_served(name)),
        served_programs=len(served),
        phases=phases,
    )


def _is_served(name: str) -> bool:
    """The served programs are named sdxl_<kind> (host/compiling/programs.py: sdxl_encode, sdxl_step_full, ...)."""
    return any(f"sdxl_{kind}" in name for kind in KINDS)


@dataclass(frozen=True)
class WarmStart:
    """App start-up with progress on (the default) and the default three sizes: cold vs warm compilation cache (the
    warm start without this host's executables: bench/cpu/startup.py measures those)."""

    args: list[str]
    cold: AppStart
    warm: AppStart
    compile_ratio: float  # warm.xla_compile_s / cold.xla_compile_s
    target: float
    meets_target: bool  # ratio <= target and every served program a cache hit on the warm start


def warm_start(steps: int, dtype: str, say: Progress = progress) -> WarmStart:
    args = ["--model", "tiny", "--steps", str(steps), "--dtype", dtype]
    with tempfile.TemporaryDirectory(prefix="sdxl-bench-warm-") as tmp:
        cold = app_start(args, Path(tmp) / "cache", "cold")
        say(f"sizes: cold start {cold.ready_s:.1f} s, XLA {cold.xla_compile_s:.1f} s over {cold.programs} programs")
        # JAX's cache alone: with this host's executables (the default) a warm start compiles nothing to count.
        warm = app_start([*args, "--no-executable-cache"], Path(tmp) / "cache", "warm")
        say(
            f"sizes: warm start {warm.ready_s:.1f} s, XLA {warm.xla_compile_s:.1f} s, "
            f"{warm.served_hits}/{warm.served_programs} served programs from the cache"
        )
    ratio = warm.xla_compile_s / cold.xla_compile_s
    all_hits = warm.served_hits == warm.served_programs > 0
    return WarmStart(args, cold, warm, ratio, TARGET_WARM_COMPILE, ratio <= TARGET_WARM_COMPILE and all_hits)
