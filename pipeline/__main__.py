"""Command line: `python -m pipeline make-tiny DIR` and `python -m pipeline generate ...`.

Bad input exits with status 2 and one line on stderr; a model that cannot be loaded exits with status 3, except a
checkpoint whose files cannot be mapped onto SDXL (single-file, missing/unmappable keys, wrong shapes, truncated):
that is bad input, status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from .errors import CheckpointError, ModelLoadError
from .options import CLI, add_options, check_env_choices
from .runtime import quiet_start, use_cpu_cores
from .samplers import sampler_id, sampler_label
from .settings import SDXL_BASE, shape_defaults
from .validation import InvalidInput

EXIT_BAD_INPUT = 2
EXIT_LOAD_FAILED = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description="SDXL on JAX, one image per device.")
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser("make-tiny", help="write a tiny random-weight SDXL-shaped checkpoint")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")

    gen = commands.add_parser(
        "generate",
        help="generate one image per device and write them as PNG",
        description="Each option can also be set by the environment variable in brackets; the flag wins.",
    )
    add_options(gen, CLI)  # the table app.py builds its parser from (pipeline/options.py)
    return parser


def _generate(args: argparse.Namespace) -> int:
    from . import distributed
    from .compilation import CompileCounter
    from .generator import Generator
    from .validation import validate_request

    # Check what the user typed before spending time on loading and compiling: the same checks as the UI and API.
    settings = _settings(args)
    randomize = str(args.seed).strip().lower() in ("random", "randomize")
    request = validate_request(
        args.prompt, args.negative_prompt, args.style, settings.pop("guidance_scale"), None if randomize else args.seed,
        randomize,
    )  # fmt: skip
    if not settings["cfg"] and (args.negative_prompt.strip() or (args.guidance_scale or 0) > 1):
        print("warning: no classifier-free guidance: --negative-prompt, --guidance-scale ignored", file=sys.stderr)
    started = time.perf_counter()
    cluster = distributed.start(distributed.options_from_args(args))  # before anything else touches JAX
    generator = Generator.from_pretrained(
        revision=args.revision,
        dtype=args.dtype,
        per_device_batch=args.per_device_batch,
        compilation_cache=not args.no_compilation_cache,
        attention=args.attention,
        **settings,  # model, shape, sampler settings, unet, variant (a preset's, the flags winning)
    )
    warmup = generator.warmup()
    warmup_compiles = generator.compile_count
    if not cluster.is_leader:
        return cluster.follow(generator, json_summary=args.json)
    try:
        result = cluster.lead(generator).generate(
            request.styled_prompt,
            negative_prompt=request.styled_negative_prompt,
            seed=request.seed,
            guidance_scale=request.guidance_scale,
        )
    finally:
        cluster.stop()
    paths = result.save_pngs(args.out)
    summary = {
        "images": [str(p) for p in paths],
        "seeds": result.seeds,
        "devices": generator.device_summary,
        "timings": {**generator.load_timings, **warmup, **{f"call_{k}": v for k, v in result.timings.items()}},
        "process_s": time.perf_counter() - started,
        "compiles": CompileCounter.compiles(),  # programs this process built, compiled or loaded from the cache
        "compilation_cache_hits": CompileCounter.cache_hits(),  # of those, loaded from the persistent cache
        "processes": cluster.process_count,
        "compiles_after_warmup": generator.compile_count - warmup_compiles,
        "truncated": result.truncated,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    for path in paths:
        print(path)
    if result.truncated:
        print(f"warning: {result.truncated}", file=sys.stderr)
    t = summary["timings"]
    print(
        f"{len(paths)} images on {generator.device_summary}: load {t['load_s']:.1f} s, cast {t['cast_s']:.1f} s, "
        f"replicate {t['replicate_s']:.1f} s, compile {t['compile_s']:.1f} s, first run {t['first_run_s']:.2f} s, "
        f"call {t['call_total_s']:.2f} s"
    )
    return 0


def _settings(args: argparse.Namespace) -> dict:
    """Model, shape, sampler settings and default guidance: explicit flags, else the preset's, else the model's."""
    from .presets import get_preset, resolve

    explicit = {
        "height": args.height, "width": args.width, "steps": args.steps, "sampler": args.sampler,
        "timestep_spacing": args.timestep_spacing, "steps_offset": args.steps_offset,
        "prediction_type": args.prediction_type, "cfg": False if args.no_cfg else None,
        "guidance_scale": args.guidance_scale, "unet": args.unet, "variant": args.variant,
    }  # fmt: skip
    if args.preset:
        settings = resolve(get_preset(args.preset), model=args.model, **explicit)
    else:
        settings = {"model": args.model or SDXL_BASE, **explicit}
    settings = {key: value for key, value in settings.items() if value is not None}
    if "sampler" in settings:  # A1111's names or the engine's ids; an unknown one is bad input (exit 2)
        settings["sampler"] = sampler_label(sampler_id(settings["sampler"]))
    settings = {"cfg": True, "guidance_scale": 5.0, **settings}
    defaults = shape_defaults(settings["model"])
    for key, default in zip(("height", "width", "steps"), defaults, strict=True):
        settings.setdefault(key, default)
    return settings


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "generate":
        check_env_choices(parser, args, CLI)
        use_cpu_cores(args.cpu_devices)  # before JAX is imported
    quiet_start()
    try:
        if args.command == "make-tiny":
            from .tiny import make_tiny

            print(make_tiny(args.directory, seed=args.seed))
            return 0
        return _generate(args)
    except (InvalidInput, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    except KeyboardInterrupt:  # Ctrl-C while loading or compiling: one line, not the libraries' traceback
        print("stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
