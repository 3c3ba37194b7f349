"""Live progress and offered sizes: what the per-step host callback costs, and start-up with one size vs all.

    python -m bench --only progress          # per-call time with vs without progress (interleaved)
    python -m bench --only sizes             # app start-up: 1 size vs SDXL's 9 ratios, cold and warm cache

Progress is static, so the comparison needs two programs of the same shape: the bench's own generator (no
progress) and a second one built with progress=True; calls alternate so drift on a shared machine hits both.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .common import Progress, Stats, progress
from .startup import app_ready

PROMPT = "a photo of an astronaut riding a horse on the moon"
TARGET_OVERHEAD = 0.03  # the goal: at most 3 % slower per call


@dataclass(frozen=True)
class ProgressOverhead:
    """Per-call seconds of the same shape with and without a host callback per denoising step."""

    steps: int  # denoising steps per call (= callbacks per device per call)
    without: Stats  # Generator.generate, program without callbacks
    with_progress: Stats  # Generator.generate with a listener, program with one callback per step
    overhead: float  # with / without medians - 1
    target: float  # goal: overhead <= target
    meets_target: bool
    reports_per_call: int  # listener calls seen in one call (must equal steps)


def progress_overhead(generator, runs: int, say: Progress = progress) -> ProgressOverhead:
    from pipeline.generator import Generator

    config = generator.config
    live = Generator.from_pretrained(
        config.model, height=config.height, width=config.width, steps=config.steps, dtype=config.dtype,
        per_device_batch=config.per_device_batch, progress=True,
    )  # fmt: skip
    live.warmup()
    seen: list[int] = []
    without, with_progress = [], []
    for i in range(runs):
        started = time.perf_counter()
        generator.generate(PROMPT, seed=i)
        without.append(time.perf_counter() - started)
        seen.clear()
        started = time.perf_counter()
        live.generate(PROMPT, seed=i, progress=lambda step, total: seen.append(step))
        with_progress.append(time.perf_counter() - started)
    plain, timed = Stats.of(without), Stats.of(with_progress)
    overhead = timed.median / plain.median - 1
    say(f"progress: {timed.median:.3f} s with vs {plain.median:.3f} s without ({overhead:+.1%})")
    return ProgressOverhead(config.steps, plain, timed, overhead, TARGET_OVERHEAD, overhead <= TARGET_OVERHEAD,
                            len(seen))  # fmt: skip


@dataclass(frozen=True)
class SizesStartup:
    """`python app.py --model tiny` until it serves, by offered sizes and cache state (seconds)."""

    one_size_cold: float  # --sizes 128x128, empty compilation cache
    one_size_warm: float  # same, second start on the filled cache
    all_sizes_cold: float  # --sizes sdxl: SDXL's 9 aspect ratios (scaled down for tiny), empty cache
    all_sizes_warm: float
    all_sizes_no_progress_cold: float  # the 9 sizes with --no-progress (programs without host callbacks)
    all_sizes_no_progress_warm: float
    sizes: int  # how many sizes "all" is


def sizes_startup(steps: int, dtype: str, say: Progress = progress, timeout_s: float = 1200) -> SizesStartup:
    from pipeline.sizes import default_sizes

    base = ["--model", "tiny", "--steps", str(steps), "--dtype", dtype]
    variants = {
        "one_size": [*base, "--sizes", "128x128"],
        "all_sizes": [*base, "--sizes", "sdxl"],
        "all_sizes_no_progress": [*base, "--sizes", "sdxl", "--no-progress"],
    }
    figures = {}
    with tempfile.TemporaryDirectory(prefix="sdxl-bench-sizes-") as tmp:
        for name, args in variants.items():
            for cache in ("cold", "warm"):
                figures[f"{name}_{cache}"] = app_ready(args, Path(tmp) / name, timeout_s)
                say(f"sizes: {name} {cache}: {figures[f'{name}_{cache}']:.1f} s")
    return SizesStartup(**figures, sizes=len(default_sizes(tiny=True, every=True)))
