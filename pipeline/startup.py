"""The engine's start-up, once, for its three entry points: app.py, `python -m pipeline generate` and
`python -m pipeline serve`.

    screened = check(config)                           # before JAX is imported: the files the options name
    started = start(config, options_from_args(args), precompiled=args.precompiled)
    started.cluster, started.engine                    # joined; loaded, precompiled installed, compiled, warm

`check` reads file names, JSON and safetensors headers only (`checkpoint/loading.resolve_model`,
`checkpoint/lora.screen_lora_dir`), the same ones loading relies on: a wrong `--model`, `--lora-dir` or
`--embeddings-dir` then fails in one line within a second or two, where loading found it only after JAX (and, in the
app, Gradio) had been imported: 10-30 s. `start` joins the cluster first (JAX waits until it joined), then loads,
installs `--precompiled` executables, compiles and warms up, logging each phase with its time: no caller ever waits
for a compile after it.

Imported inside functions: the engine (`generator`, `cluster`, `host`; heavy: JAX, which `start` imports after the
CPU device count is set) and the checkpoint readers (`checkpoint`; heavy: ml_dtypes, 0.6 s, which `python -m
pipeline --help` and a bad flag do not wait for). This module imports no JAX itself.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .config import TINY_MODEL, EngineConfig
from .contract.request import Request, asks_for_levers

if TYPE_CHECKING:  # neither is imported at run time before `start` (both import JAX)
    from .cluster.join_options import ClusterOptions
    from .cluster.protocol import Cluster
    from .generator import Generator
    from .host.compiling.aot import LoadReport

logger = logging.getLogger("sdxl_jax.startup")


@dataclass(frozen=True)
class Screened:
    """What `check` found in the LoRA folder: the LoRAs a load would offer and those it refuses (name -> why)."""

    loras: tuple[str, ...] = ()
    refused: Mapping[str, str] = field(default_factory=dict)


def check(config: EngineConfig) -> Screened:
    """The model, the LoRA folder and the embeddings folder `config` names, checked before JAX is imported: each
    raises its one-line error (ModelLoadError or CheckpointError: bad input); the LoRAs' screening is returned."""
    check_model(config)
    screened = screen_loras(config)
    check_embeddings(config)
    return screened


def check_model(config: EngineConfig) -> None:
    """Raise the one-line error of a model that cannot load: no such directory, a file, not SDXL, an absent variant.
    The tiny model is built when first loaded, not here: it is no path a user can get wrong."""
    from .checkpoint.loading import resolve_model

    if str(config.model).strip() != TINY_MODEL:
        resolve_model(config.model, config.variant)


def screen_loras(config: EngineConfig) -> Screened:
    """The LoRAs of `config.lora_dir` a load would offer and those it refuses, from their headers; none without a
    folder. A folder that does not exist raises its one-line error."""
    if not config.lora_dir:
        return Screened()
    from .checkpoint.lora import screen_lora_dir

    offered, refused = screen_lora_dir(config.lora_dir)
    return Screened(tuple(offered), refused)


def check_embeddings(config: EngineConfig) -> None:
    """A `--embeddings-dir` that is no folder fails now, with loading's own sentence; each file is read at load, where
    the checkpoint's text encoders say which embeddings fit them (`checkpoint/embeddings.load_embeddings_dir`)."""
    if config.embeddings_dir and not Path(config.embeddings_dir).is_dir():
        from .checkpoint.embeddings import EmbeddingFileError

        raise EmbeddingFileError(f"Embeddings directory {config.embeddings_dir} does not exist or is not a directory.")


@dataclass(frozen=True)
class Started:
    """A started engine: the cluster it joined (one process: a cluster of one), the engine, loaded and warm, and what
    its warm-up and `--precompiled` did."""

    cluster: Cluster
    engine: Generator
    warmup: dict[str, float]  # Generator.warmup's timings: compile_s, first_run_s, the programs' phases
    precompiled: LoadReport | None = None  # which executables were loaded, which compiled and why (None: none given)


def start(
    config: EngineConfig,
    options: ClusterOptions,
    *,
    precompiled: str | None = None,
    only: Request | None = None,
    on_loaded: Callable[[Generator], None] | None = None,
) -> Started:
    """Join the cluster `options` describe (a single process: none to join), then load, place, install
    `precompiled`'s executables, compile and warm up the engine `config` describes, logging each phase. `only`: the
    one request this process will run (the CLI's), so a single process leaves out the programs it never needs.
    `on_loaded(generator)` logs a caller's own lines once the model is placed, before the compile (the app's sizes,
    sampler and CPU notice)."""
    from .cluster.join import start as join

    joined = join(options)  # before anything else touches JAX
    # After JAX is imported: set before, JAX would take it as its own level and add a second handler (every line twice).
    logging.getLogger("jax").setLevel(logging.WARNING)  # backend probing ("Unable to initialize backend 'tpu'")
    if only is not None and joined.process_count == 1 and not asks_for_levers(only):
        # One process, one request: the levers' programs (half of a start-up's) would never run. A request at
        # guidance <= 1 then runs the CFG step and keeps its conditional half: twice the step's work, less than
        # compiling the guidance-free step, and the same picture to XLA's rounding (on the tiny model 5 values of
        # 98,304 one level apart). Followers keep them all: a leader may send a lever.
        config = dataclasses.replace(config, speed_levers=False)
    with joined.failed_calls_as_one_line():  # a peer killed while the weights are placed: one line, no traceback
        generator, warm, report = _load_and_warm(config, precompiled, on_loaded)
    return Started(joined, generator, warm, report)


def _load_and_warm(
    config: EngineConfig, precompiled: str | None, on_loaded: Callable[[Generator], None] | None
) -> tuple[Generator, dict[str, float], LoadReport | None]:
    """`start`'s work after the join: load and place the weights, install `precompiled`, compile and warm up."""
    from .generator import Generator

    logger.info("loading %s: %d×%d, %d steps", config.model, config.width, config.height, config.steps)
    started = time.perf_counter()
    generator = Generator.load(config)
    for phase in ("load", "cast", "replicate"):
        logger.info("%-9s %7.2f s", phase, generator.load_timings[f"{phase}_s"])
    config = generator.config
    logger.info(
        "ready to compile: %s, %d×%d, %d steps, %s, %s attention, %d images per request",
        generator.device_summary,
        config.width,
        config.height,
        config.steps,
        config.dtype,
        config.attention,
        generator.num_images,
    )
    if on_loaded is not None:
        on_loaded(generator)
    report = None
    if precompiled:  # one line (host/compiling/aot.py logs it): which programs were loaded, which are compiled and why
        from .host.compiling.aot import call_size_directory, load_precompiled

        report = load_precompiled(generator.programs, generator.program_keys(), precompiled)
        for n, programs in generator.call_programs.items():  # --merge-requests: the smaller calls', in their folders
            if programs is not generator.programs:
                load_precompiled(programs, generator.merged_program_keys(), call_size_directory(precompiled, n))
    warm = generator.warmup()
    for phase, key in (("compile", "compile_s"), ("first run", "first_run_s")):
        logger.info("%-9s %7.2f s", phase, warm[key])
    logger.info("engine ready in %.1f s", time.perf_counter() - started)
    return generator, warm, report
