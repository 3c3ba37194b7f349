"""Command line: `python -m pipeline make-tiny DIR` and `python -m pipeline generate ...`.

Bad input exits with status 2 and one line on stderr; a model that cannot be loaded exits with status 3.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from .loading import ModelLoadError
from .settings import ATTENTIONS, DTYPES, SDXL_BASE
from .validation import GUIDANCE_MAX, GUIDANCE_MIN, InvalidInput

EXIT_BAD_INPUT = 2
EXIT_LOAD_FAILED = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description="SDXL on JAX, one image per device.")
    commands = parser.add_subparsers(dest="command", required=True)

    tiny = commands.add_parser("make-tiny", help="write a tiny random-weight SDXL-shaped checkpoint")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")

    gen = commands.add_parser("generate", help="generate one image per device and write them as PNG")
    gen.add_argument(
        "--model", default=SDXL_BASE, help=f"Hub id, local diffusers Flax directory, or 'tiny' (default {SDXL_BASE})"
    )
    gen.add_argument("--revision", default=None, help="Hub revision (default: refs/pr/95 for SDXL base)")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--negative-prompt", default="")
    gen.add_argument("--seed", default="0", help="0..4294967295, or 'random' (default 0)")
    gen.add_argument(
        "--guidance-scale", type=float, default=5.0, help=f"{GUIDANCE_MIN:g}..{GUIDANCE_MAX:g} (default 5)"
    )
    gen.add_argument("--steps", type=int, default=25)
    gen.add_argument("--height", type=int, default=1024)
    gen.add_argument("--width", type=int, default=1024)
    gen.add_argument("--dtype", choices=DTYPES, default=None, help="default: bfloat16 on TPU/GPU, float32 on CPU")
    gen.add_argument("--per-device-batch", type=int, default=1)
    gen.add_argument(
        "--attention", choices=ATTENTIONS, default="auto", help="UNet attention core (default auto; see README)"
    )
    gen.add_argument("--no-compilation-cache", action="store_true", help="do not use JAX's persistent cache")
    gen.add_argument("--out", required=True, help="directory for the PNG files")
    gen.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    return parser


def _generate(args: argparse.Namespace) -> int:
    from .compilation import CompileCounter
    from .generator import Generator
    from .validation import check_guidance, clean_text, resolve_seed

    # Check what the user typed before spending time on loading and compiling.
    randomize = str(args.seed).strip().lower() in ("random", "randomize")
    seed = resolve_seed(None if randomize else args.seed, randomize=randomize)
    prompt = clean_text(args.prompt, field="prompt")
    negative_prompt = clean_text(args.negative_prompt, field="negative prompt")
    guidance_scale = check_guidance(args.guidance_scale)
    started = time.perf_counter()
    generator = Generator.from_pretrained(
        args.model,
        revision=args.revision,
        height=args.height,
        width=args.width,
        steps=args.steps,
        dtype=args.dtype,
        per_device_batch=args.per_device_batch,
        compilation_cache=not args.no_compilation_cache,
        attention=args.attention,
    )
    warmup = generator.warmup()
    result = generator.generate(prompt, negative_prompt=negative_prompt, seed=seed, guidance_scale=guidance_scale)
    paths = result.save_pngs(args.out)
    summary = {
        "images": [str(p) for p in paths],
        "seeds": result.seeds,
        "devices": generator.device_summary,
        "timings": {**generator.load_timings, **warmup, **{f"call_{k}": v for k, v in result.timings.items()}},
        "process_s": time.perf_counter() - started,
        "compiles": CompileCounter.compiles(),  # programs this process built, compiled or loaded from the cache
        "compilation_cache_hits": CompileCounter.cache_hits(),  # of those, loaded from the persistent cache
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "make-tiny":
            from .tiny import make_tiny

            print(make_tiny(args.directory, seed=args.seed))
            return 0
        return _generate(args)
    except InvalidInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED


if __name__ == "__main__":
    sys.exit(main())
