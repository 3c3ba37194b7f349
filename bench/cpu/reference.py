"""Part 1: per-call latency of `Generator.generate` against diffusers' own FlaxStableDiffusionXLPipeline.

The reference is called as Hugging Face's SDXL-on-JAX blog calls it: params replicated once
with flax's `replicate`; per call `prepare_inputs`, `replicate` of the ids, one PRNG key per device, the pmapped
`pipeline(..., jit=True)`, and conversion to PIL. Both sides return PIL images, so the whole user-visible call is
timed on each. Same checkpoint, devices, size, steps and dtype; calls are interleaved after both are warmed.
diffusers' pipeline runs in a worker process with the reference venv's python (bench/cpu/reference_worker.py,
bench/reference_venv.py: its libraries cannot live beside the app's); this process times the engine's call, then
asks the worker for one call, which reports its wall, host and process CPU seconds, then times the engine once more
on a new text. The timed engine calls repeat one text, as a person trying seeds does, which the engine encodes once
(host/text_cache.py); the new text's calls encode it, as the reference does every call. Each call's part: the engine's
programs (encode, start, each step kind, decode; blocking on each, after the timed runs) and host work, the
reference's host work and its one pmapped program. `python -m bench --check` fails when
the CPU-seconds ratio is over `CHECK_RATIO` (the guard CI runs: .ci/run).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..common import Progress, Stats, progress, timed
from .program_times import ProgramTimer
from .reference_worker import thread_cpu_seconds

PROMPT = "a photo of an astronaut riding a horse on the moon, highly detailed"
NEGATIVE = "blurry, low quality"
GUIDANCE = 5.0
TARGET_RATIO = 0.9
#: `--check` fails when the engine's process CPU seconds per call exceed the reference's by this factor. CPU seconds,
#: not wall time: they count the work each side does, which the other jobs on a shared machine barely move (on this
#: 2-core VM at load 10-17 the same engine's wall ratio moved 0.85-0.91 and its CPU ratio 1.03-1.06; the issue-35
#: regression gave wall 1.13-1.27 and CPU 1.27-1.32; at 64², 2 steps, CPU 0.96-1.03 against 1.29-1.31). The runs:
#: bench/HISTORY.md, "Engine vs diffusers: the regression of issue 35 and its guard".
CHECK_RATIO = 1.15


@dataclass(frozen=True)
class EngineVsReference:
    """Engine vs diffusers' reference pipeline, same work per call."""

    images_per_call: int  # images one call returns (one per device x per-device batch)
    engine: Stats  # seconds per Generator.generate call (PIL images out)
    reference: Stats  # seconds per reference call (tokenize, replicate, pmapped pipeline, PIL images out)
    engine_images_per_s: float  # images_per_call / engine median
    reference_images_per_s: float  # images_per_call / reference median
    ratio: float  # engine median / reference median (lower is better)
    target_ratio: float  # the goal: ratio <= this
    meets_target: bool  # ratio <= target_ratio
    engine_host: Stats  # seconds of each engine call spent on the host (tokenize, transfer in, PIL + PNG text)
    reference_host: Stats  # seconds of each reference call on the host (prepare_inputs, replicate, keys, PIL)
    reference_load_s: float  # seconds to start the reference's worker, load + cast + replicate its params
    reference_first_call_s: float  # the reference's first call (pmap compile + run)
    pair_ratios: Stats  # engine / reference of each interleaved pair (a load change hits both halves of a pair)
    cpu_ratio: float  # engine process / worker process CPU seconds per call (medians): the work, whatever else runs
    engine_programs: dict[str, float]  # seconds per call in each program, blocking on each (label -> s; the text's
    #                                    encode too: these calls keep no text, host/text_cache.py)
    engine_programs_s: float  # such a call with every program blocked on (their sum plus the host's part)
    #: engine / worker CPU seconds per call when each engine call reads a new text (the text cache never hits: the
    #: engine encodes every call, as diffusers' pipeline does), interleaved with the others; `cpu_ratio`'s calls
    #: repeat one text, as a person trying seeds does
    new_text_cpu_ratio: float = 0.0
    #: CPU ms per call (mean of the timed calls) by thread group (reference_worker.THREAD_GROUPS), each side: where
    #: the work runs (the caller, XLA:CPU's pool, the runtime's other threads); {} off Linux
    engine_cpu_ms_by_thread: dict[str, float] = field(default_factory=dict)
    reference_cpu_ms_by_thread: dict[str, float] = field(default_factory=dict)
    reference_packages: dict[str, str] = field(default_factory=dict)  # the reference venv's versions (its worker's)


#: Seconds the worker may take to answer one request: its start and load, or one call (the first compiles; SDXL's
#: pmapped pipeline compiles for minutes on an accelerator).
ANSWER_TIMEOUT_S = 3600.0
WORKER = Path(__file__).resolve().parent / "reference_worker.py"


class ReferenceWorkerError(RuntimeError):
    """The reference worker failed, died or did not answer: one sentence saying which and why."""


def load_reference(model: str, dtype: str) -> dict:
    """The worker's load request for diffusers' pipeline from `model`'s Flax checkpoint folder (a hub id or "tiny"
    resolved here), cast like the blog: bf16 except the scheduler, or all f32."""
    from ..engine import resolve_model

    return {"mode": "checkpoint", "path": str(resolve_model(model)), "dtype": dtype}


def sdxl_reference(networks, dtype: str, tokenizer_dir: Path) -> dict:
    """The worker's load request for diffusers' pipeline with SDXL base 1.0's architectures
    (bench/accelerator/flops.py's configs) and random weights of the engine's shapes, made by the worker (a program's
    time does not depend on its weights' values), the tokenizers in `tokenizer_dir`/tokenizer{,_2} (the tiny
    checkpoint's, as the engine's) and its Euler scheduler from `networks`' scheduler config: the reference where no
    checkpoint folder exists (`python -m bench accelerator`'s random SDXL-shaped weights)."""
    from ..accelerator.flops import SDXL_TEXT_2_CONFIG, SDXL_TEXT_CONFIG, SDXL_UNET_CONFIG, SDXL_VAE_CONFIG

    return {
        "mode": "sdxl",
        "dtype": dtype,
        "unet": SDXL_UNET_CONFIG,
        "vae": SDXL_VAE_CONFIG,
        "text_encoder": SDXL_TEXT_CONFIG,
        "text_encoder_2": SDXL_TEXT_2_CONFIG,
        "tokenizer": str(tokenizer_dir / "tokenizer"),
        "tokenizer_2": str(tokenizer_dir / "tokenizer_2"),
        "scheduler_config": dict(networks.scheduler_config),
    }


class ReferenceWorker:
    """diffusers' pipeline in bench/cpu/reference_worker.py, run by the reference venv's python (its libraries cannot
    live beside the app's: requirements-reference.txt). JSON lines over its stdin and stdout; every wait is bounded
    by `timeout_s`; on any failure the worker is killed and `ReferenceWorkerError` says why in one sentence. Use as a
    context manager: leaving it closes the worker's stdin (it exits) and waits for it. A subclass names another
    worker script speaking the same protocol (bench/accelerator/torch_peer.py's)."""

    script = WORKER  # the worker's file, run by `python`
    name = "reference worker"  # what the errors call it

    def __init__(self, spec: dict, python: Path | None = None, timeout_s: float = ANSWER_TIMEOUT_S):
        self.spec, self.python, self.timeout_s = spec, python, timeout_s
        self.process: subprocess.Popen | None = None
        self.devices = 0
        self.load_s = 0.0
        self.started = 0.0  # perf_counter() at its launch
        self.answered = 0.0  # perf_counter() when its last answer came
        self.packages: dict[str, str] = {}

    def start(self) -> ReferenceWorker:
        """Launch the worker and send its load request without waiting for the answer (`__enter__` waits): the
        speed guard starts it before its engine compiles, so the two loads share the wall."""
        from ..reference_venv import ReferenceVenvError, reference_python

        if self.process is not None:
            return self
        try:
            python = self.python or reference_python()
        except ReferenceVenvError as exc:
            raise ReferenceWorkerError(f"no reference venv: {exc}") from None
        self.started = time.perf_counter()
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false")}
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (close() closes it) its last line explains a death
        self.process = subprocess.Popen(
            [str(python), str(self.script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=self.script.parent,
        )
        self._answers: queue.Queue[tuple[str | None, float]] = queue.Queue()  # each line, when it came
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        self._send({"load": self.spec})
        return self

    def __enter__(self) -> ReferenceWorker:
        """The worker, started (`start`) if it was not, once it has loaded diffusers' pipeline."""
        self.start()
        try:
            ready = self._answer("load diffusers' pipeline")
        except BaseException:
            self.close(kill=True)
            raise
        self.devices, self.load_s, self.packages = ready["devices"], ready["load_s"], ready["packages"]
        self.ready = ready  # the whole answer: a worker may say more (the torch worker: its device's name)
        return self

    def __exit__(self, *exc_info) -> None:
        self.close(kill=exc_info[0] is not None)

    def call(self, **request) -> dict:
        """One reference call: {"images", "wall_s", "host_s", "cpu_s"} (bench/cpu/reference_worker.py)."""
        try:
            return self._ask({"call": request}, "run diffusers' pipeline")
        except BaseException:
            self.close(kill=True)
            raise

    def close(self, kill: bool = False) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if not kill:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the worker exits when its stdin closes
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill = True
        if kill:
            process.kill()
            process.wait(timeout=60)
        with contextlib.suppress(OSError):
            process.stdin.close()
        self._stderr.close()

    def _read(self, stream) -> None:
        for line in stream:
            self._answers.put((line, time.perf_counter()))
        self._answers.put((None, time.perf_counter()))  # the worker closed its stdout: it has exited or is exiting

    def _ask(self, message: dict, what: str) -> dict:
        self._send(message)
        return self._answer(what)

    def _send(self, message: dict) -> None:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except OSError:
            pass  # the worker is gone: its pipe broke (the answer's wait says why)

    def _answer(self, what: str) -> dict:
        try:
            line, self.answered = self._answers.get(timeout=self.timeout_s)
        except queue.Empty:
            raise ReferenceWorkerError(f"the {self.name} did not {what} within {self.timeout_s:.0f} s") from None
        if line is None:
            raise ReferenceWorkerError(f"the {self.name} exited before it could {what}: {self._last_error()}")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise ReferenceWorkerError(f"the {self.name} answered {line.strip()[:80]!r}, not JSON") from None
        if "error" in answer:
            raise ReferenceWorkerError(f"the {self.name} could not {what}: {answer['error']}")
        return answer

    def _last_error(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        self._stderr.seek(0)
        lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        status = f"exit status {self.process.returncode}" if self.process.returncode is not None else "no exit status"
        return lines[-1] if lines else status


def engine_vs_reference(
    generator,
    runs: int,
    say: Progress = progress,
    reference: dict | None = None,
    python: Path | None = None,
    worker: ReferenceWorker | None = None,
) -> EngineVsReference:
    """Time `runs` interleaved calls of each (engine, reference, engine, ...) after one warm call of each.
    `reference`: the worker's load request (`sdxl_reference`) when not the checkpoint the generator loaded;
    `python`: the reference's python (default: the reference venv's); `worker`: one already started (`start`) with
    its load request, instead of starting one now."""
    config = generator.config
    kwargs = {
        "prompt": PROMPT,
        "negative_prompt": NEGATIVE,
        "guidance_scale": GUIDANCE,
        "steps": config.steps,
        "height": config.height,
        "width": config.width,
    }
    if worker is None:
        say("starting diffusers' pipeline in the reference venv ...")
        worker = ReferenceWorker(reference or load_reference(config.model, config.dtype), python).start()
    with worker:
        load_s = worker.answered - worker.started  # launch to loaded, however long ago it was started
        say(f"reference loaded in {load_s:.1f} s; first reference call (pmap compile) ...")
        first = worker.call(seed=0, **kwargs)
        if first["images"] != generator.num_images:
            raise RuntimeError(f"reference returned {first['images']} images, the engine {generator.num_images}")

        def engine_call(seed: int):
            request = generator.request(PROMPT, negative_prompt=NEGATIVE, guidance_scale=GUIDANCE, seed=seed)
            return generator.generate(request)

        engine_call(0)  # engine warm too
        engine_s, reference_s, engine_host, reference_host, engine_cpu, reference_cpu = [], [], [], [], [], []
        new_text_cpu = []  # the engine's CPU seconds with a new text each call
        engine_threads: list[dict[str, float]] = []  # each timed engine call's CPU seconds by thread group
        reference_threads: list[dict[str, float]] = []
        for run in range(runs):
            seed = 1000 + run
            threads = thread_cpu_seconds()
            cpu = time.process_time()
            t_engine, result = timed(lambda seed=seed: engine_call(seed))
            engine_cpu.append(time.process_time() - cpu)
            engine_threads.append({group: s - threads[group] for group, s in thread_cpu_seconds().items()})
            answer = worker.call(seed=seed, **kwargs)  # the worker's own wall, host and process CPU seconds
            reference_threads.append(answer.get("threads", {}))
            reference_cpu.append(answer["cpu_s"])
            reference_host.append(answer["host_s"])
            engine_host.append(result.timings["host_s"])
            engine_s.append(t_engine)
            reference_s.append(answer["wall_s"])
            cpu = time.process_time()  # and a text no call read before: its text programs run (host/text_cache.py)
            generator.generate(
                generator.request(
                    f"{PROMPT}, variation {run}", negative_prompt=NEGATIVE, guidance_scale=GUIDANCE, seed=seed
                )
            )
            new_text_cpu.append(time.process_time() - cpu)
            say(f"  run {run + 1}/{runs}: engine {t_engine:.3f} s, reference {answer['wall_s']:.3f} s")
    engine, reference = Stats.of(engine_s), Stats.of(reference_s)
    ratio = engine.median / reference.median
    profiled = max(1, min(runs, 3))
    from ..engine import TextCache

    kept, generator.text_cache = generator.text_cache, TextCache(0)  # the profile has the text's program too
    try:
        with ProgramTimer(generator.programs, block=True) as timer:
            blocked_s = [timed(lambda seed=seed: engine_call(seed))[0] for seed in range(2000, 2000 + profiled)]
    finally:
        generator.text_cache = kept
    n = generator.num_images
    return EngineVsReference(
        images_per_call=n,
        engine=engine,
        reference=reference,
        engine_images_per_s=n / engine.median,
        reference_images_per_s=n / reference.median,
        ratio=ratio,
        target_ratio=TARGET_RATIO,
        meets_target=ratio <= TARGET_RATIO,
        engine_host=Stats.of(engine_host),
        reference_host=Stats.of(reference_host),
        reference_load_s=load_s,
        reference_first_call_s=first["wall_s"],
        pair_ratios=Stats.of([e / r for e, r in zip(engine_s, reference_s, strict=True)]),
        cpu_ratio=Stats.of(engine_cpu).median / Stats.of(reference_cpu).median,
        engine_programs=timer.per_program(profiled),
        engine_programs_s=Stats.of(blocked_s).median,
        new_text_cpu_ratio=Stats.of(new_text_cpu).median / Stats.of(reference_cpu).median,
        engine_cpu_ms_by_thread=_mean_ms(engine_threads),
        reference_cpu_ms_by_thread=_mean_ms(reference_threads),
        reference_packages=worker.packages,
    )


def _mean_ms(calls: list[dict[str, float]]) -> dict[str, float]:
    """Per thread group, the calls' mean CPU milliseconds ({} when no call reported groups)."""
    groups = [group for group in calls[0] if all(group in call for call in calls)] if calls else []
    return {group: 1000 * sum(call[group] for call in calls) / len(calls) for group in groups}


def check_ratio(result: EngineVsReference, threshold: float) -> str | None:
    """`--check`: None when the engine / reference ratio of CPU seconds per call is at most `threshold`, else the
    sentence saying by how much, with each side's time and the engine's parts."""
    if result.cpu_ratio <= threshold:
        return None
    parts = ", ".join(f"{label} {seconds * 1000:.1f}" for label, seconds in result.engine_programs.items())
    return (
        f"engine / diffusers = {result.cpu_ratio:.2f} in CPU seconds > {threshold:g} (wall {result.ratio:.2f}: engine "
        f"{result.engine.median * 1000:.0f} ms, diffusers {result.reference.median * 1000:.0f} ms per call; the "
        f"engine's programs in ms: {parts})"
    )
