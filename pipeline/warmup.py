"""The engine's warm-up (`Generator.warmup`): every served program built before the first visitor comes, then each
offered size run once, so no request waits for a compile or a first call's set-up.

    timings = warm_up(generator)       # compile_s, the programs' phases, first_run_s

Each program is loaded from this host's executables or traced, lowered and compiled
(`host/compiling/executable_store.build_served`): the programs of a call of N images per device and, with
--merge-requests, those of each smaller call size; then each ESRGAN model's tile program and the LoRA sets' merge.
"""

from __future__ import annotations

import logging
import time

from .host.compiling.executable_store import StartupPrograms, build_served
from .merged_calls import ticket_of

logger = logging.getLogger(__name__)


def warm_up(generator) -> dict[str, float]:
    """Build every program `generator` serves (its `startup_programs` say how each was got), then run each offered
    size once; compile_s (all of the programs' phase) and first_run_s are totals, with the programs' phases apart
    (`host/compiling/executable_store.StartupPrograms.timings`)."""
    started = time.perf_counter()
    generator.startup_programs = startup_programs(generator)
    logger.info("%s", generator.startup_programs.summary())
    for upscaler in generator.upscalers.values():  # each ESRGAN model's one tile program
        upscaler.compile()
    if generator.loras is not None:
        generator.loras.prepare()
    timings = {"compile_s": time.perf_counter() - started, **generator.startup_programs.timings(), "first_run_s": 0.0}
    for size in generator.sizes:
        timings["first_run_s"] += first_run(generator, size)
    return timings


def startup_programs(generator) -> StartupPrograms:
    """Every served program built: a call of N images per device's (`Generator.program_keys`), then with
    --merge-requests each smaller call size's (`Generator.merged_program_keys`)."""
    store = generator.config.compilation_cache and generator.config.executable_cache
    built = build_served(generator.programs, generator.program_keys(), store=store)
    for programs in generator.call_programs.values():  # --merge-requests: the smaller calls' programs
        if programs is not generator.programs:
            built = built.joined(build_served(programs, generator.merged_program_keys(), store=store))
    return built


def first_run(generator, size: tuple[int, int]) -> float:
    """One request at `size` (height, width) as a visitor's runs, and with --merge-requests one merged call of each
    smaller call size: the seconds they took."""
    (height, width), started = size, time.perf_counter()
    generator.generate(generator.request("warm-up", size=size))
    for n in list(generator.call_programs)[1:] if generator.merger is not None else ():  # the other call sizes, once
        run = generator.plan(generator.request("warm-up", size=size))
        if run.merge_key is not None:  # (a default refiner switch does not merge: its programs are N's)
            generator.run_group([ticket_of(run) for _ in range(n)])
    first_run_s = time.perf_counter() - started
    logger.info("first run %d×%d, %d steps: %.2f s", width, height, generator.config.steps, first_run_s)
    return first_run_s
