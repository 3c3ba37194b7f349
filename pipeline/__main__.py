"""Command line: `python -m pipeline make-tiny DIR`, `python -m pipeline generate ...` and
`python -m pipeline precompile --topology v5e:2x2 [app options] --out DIR` (executables for a precompiled start-up).

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
from .presets import PRESET_NAMES
from .runtime import quiet_start, skip_absent_tpu, use_cpu_cores
from .samplers import PREDICTION_TYPES, SAMPLER_NAMES, SPACINGS, sampler_id, sampler_label
from .settings import ATTENTIONS, DTYPES, SDXL_BASE, TINY_MODEL, shape_defaults
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

    pre = commands.add_parser("precompile", help="compile the served programs for a topology into a directory")
    pre.add_argument("--topology", default="v5e:2x2",
                     help="TPU topology (v5e:2x2, v6e:2x2, ...; needs libtpu, not a TPU) or 'cpu' = this host's CPU "
                     "devices (default v5e:2x2)")  # fmt: skip
    pre.add_argument("--out", required=True, help="directory for the executables and manifest.json")
    pre.add_argument("--model", default=None, help=f"as app.py (default {SDXL_BASE}); weights are read for shapes")
    pre.add_argument("--preset", choices=PRESET_NAMES, default=None)
    pre.add_argument("--sampler", default=None, help=f"{', '.join(SAMPLER_NAMES)} (as app.py)")
    pre.add_argument("--timestep-spacing", choices=SPACINGS, default=None)
    pre.add_argument("--steps-offset", type=int, default=None)
    pre.add_argument("--prediction-type", choices=PREDICTION_TYPES, default=None)
    pre.add_argument("--no-cfg", action="store_true")
    pre.add_argument("--revision", default=None)
    pre.add_argument("--variant", default=None)
    pre.add_argument("--unet", default=None)
    pre.add_argument("--height", type=int, default=None)
    pre.add_argument("--width", type=int, default=None)
    pre.add_argument("--sizes", default=None, help="as app.py (default: the app's three; --height/--width: one)")
    pre.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on TPU, float32 on cpu")
    pre.add_argument("--per-device-batch", type=int, default=1)
    pre.add_argument("--attention", choices=ATTENTIONS, default="auto")
    pre.add_argument("--cpu-devices", type=int, default=None, help="with --topology cpu: as app.py")
    pre.set_defaults(steps=None, guidance_scale=None)
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
    if args.precompiled:
        from .aot import load_precompiled

        report = load_precompiled(generator.programs, generator.program_keys(), args.precompiled)
        print(report.summary(args.precompiled), file=sys.stderr)  # which were loaded, which are compiled and why
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


def _precompile(args: argparse.Namespace) -> int:
    from .aot import precompile
    from .sizes import default_sizes, parse_sizes

    settings = _settings(args)
    tiny = settings["model"].strip() == TINY_MODEL
    if args.sizes:
        sizes = parse_sizes(args.sizes, tiny=tiny)
    elif (settings["height"], settings["width"]) != shape_defaults(settings["model"])[:2]:
        sizes = [(settings["height"], settings["width"])]  # --height/--width (or a preset's size): that one, as app.py
    else:
        sizes = default_sizes(tiny=tiny)
    overrides = {k: settings.get(k) for k in ("sampler", "timestep_spacing", "prediction_type", "steps_offset", "cfg")}
    started = time.perf_counter()
    manifest = precompile(
        settings["model"], topology=args.topology, out=args.out, sizes=sizes, dtype=args.dtype,
        per_device_batch=args.per_device_batch, attention=args.attention, revision=args.revision,
        variant=settings.get("variant"), unet=settings.get("unet"),
        sampler_overrides={k: v for k, v in overrides.items() if v is not None}, progress=print,
    )  # fmt: skip
    print(f"{len(manifest['programs'])} programs for {manifest['device_count']} x {manifest['device_kind']} in "
          f"{args.out} ({time.perf_counter() - started:.0f} s)")  # fmt: skip
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
    if args.command == "generate" or (args.command == "precompile" and args.topology == "cpu"):
        use_cpu_cores(args.cpu_devices)  # before JAX is imported
    elif args.command == "precompile":
        skip_absent_tpu()  # compiling for a TPU topology needs libtpu, not a TPU: no probe for one
    quiet_start()
    try:
        if args.command == "make-tiny":
            from .tiny import make_tiny

            print(make_tiny(args.directory, seed=args.seed))
            return 0
        if args.command == "precompile":
            return _precompile(args)
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
