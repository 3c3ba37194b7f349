"""Command line: `python -m pipeline make-tiny DIR`, `python -m pipeline generate ...`,
`python -m pipeline precompile --topology v5e:2x2 [engine options] --out DIR` (executables for a precompiled
start-up) and `python -m pipeline serve [engine options] --port N` (the engine as an HTTP service,
pipeline/service/). All read the engine's options as the app does (pipeline/options.py, `config.engine_config`).

Bad input exits with status 2 and one line on stderr; a model that cannot be loaded exits with status 3, except a
`--model` that names no checkpoint (no such directory, a file) or one whose files cannot be mapped onto SDXL
(single-file, missing/unmappable keys, wrong shapes, truncated): that is bad input, status 2, as in the app. The
arguments and the files they name are checked before JAX is imported (`_check`, pipeline/startup.py): a mistake
is said before JAX has taken its seconds to import.

Imported inside functions (heavy: JAX): each command imports its part of the engine (`startup`, `cluster`, `host`,
`precompile`, `checkpoint`, `service`) when it runs, after its arguments are checked and the CPU device count is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # before the imports below: run before `pip install`, one sentence, not a traceback
    from .installed import require_installed

    require_installed("python -m pipeline")

from .config import EngineConfig, engine_config  # noqa: E402
from .contract.errors import CheckpointError, InvalidInput, ModelLoadError  # noqa: E402
from .contract.fields import FIELD, FIELDS, resolve_seed  # noqa: E402
from .contract.image_files import save_png  # noqa: E402
from .contract.image_inputs import GivenPath  # noqa: E402
from .contract.parameters import model_name  # noqa: E402
from .contract.request import LORA_TAG, Request, RequestRules, parse_request  # noqa: E402
from .contract.xyz_plot import Cell, Plot  # noqa: E402
from .contract.xyz_run import run_plot  # noqa: E402
from .options import CLI, MAKE_TINY, PRECOMPILE, SERVE, Parser, add_options, check_env_choices, request_option  # noqa: E402
from .platform import quiet_start, skip_absent_tpu, use_cpu_cores  # noqa: E402
from .service.command_line import build_serve_parser  # noqa: E402
from .startup import check, check_embeddings, check_model, screen_loras  # noqa: E402

EXIT_BAD_INPUT = 2
EXIT_LOAD_FAILED = 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m pipeline", description="SDXL on JAX, one image per device.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    tiny = commands.add_parser("make-tiny", help="write a tiny random-weight SDXL-shaped checkpoint")
    add_options(tiny, MAKE_TINY)

    gen = commands.add_parser(
        "generate",
        help="generate one image per device (N with --images-per-device N) and write them as PNG",
        description="Each option can also be set by the environment variable in brackets; the flag wins.",
    )
    add_options(gen, CLI)  # the options table (pipeline/options.py), as the app's

    pre = commands.add_parser(
        "precompile",
        help="compile the served programs for a topology into a directory",
        description="The app's engine options, read as the app reads them; the programs go to --out.",
    )
    add_options(pre, PRECOMPILE)  # its --topology and --out too
    build_serve_parser(commands)
    return parser


def _check(args: argparse.Namespace) -> tuple[EngineConfig, Request, list[Cell]]:
    """What the user typed and the files it names, checked before JAX is imported (a mistake costs a moment, not a
    load): the LoRA folder's, the page's and API's (`parse_request`), then the model's and the embeddings folder's
    (pipeline/startup.py)."""
    config = dataclasses.replace(engine_config(args), previews=False)  # nobody watches the CLI's images form
    # The request's own flags are what it asks for; the server's defaults are what it would get without them.
    unasked = engine_config(argparse.Namespace(**{**vars(args), "guidance_scale": None}))
    plot = _plot(args)
    if scales := _hires_scales(args, plot):  # the hires fix: the CLI compiles the second passes its requests ask for
        config, unasked = (dataclasses.replace(c, hires_scales=scales) for c in (config, unasked))
    if extras := _unet_extras(args):  # FreeU, PAG: the CLI compiles the steps its request asks for
        config, unasked = (dataclasses.replace(c, **extras) for c in (config, unasked))
    rules = RequestRules.of(unasked)
    if config.lora_dir:  # the LoRAs a load would offer, from their headers: a missing folder or name fails now
        screened = screen_loras(config)
        rules = dataclasses.replace(rules, loras=screened.loras)
        asked = [_lora(text)[0] for text in args.lora] + [m.group(1) for m in LORA_TAG.finditer(args.prompt)]
        for name in asked:
            if why := screened.refused.get(name.strip()):
                raise InvalidInput(f"LoRA '{name.strip()}' is not offered: {why}")
    given = request_arguments(args)
    request = parse_request(**given, rules=rules)
    cells = (
        plot.cells(given, lambda fields: parse_request(**fields, rules=rules), model=model_name(config.model))
        if plot is not None
        else []
    )
    check_model(config)  # a wrong --model is bad input too
    check_embeddings(config)
    check_out_folder(args.out, "--out")
    return config, request, cells


def _plot(args: argparse.Namespace) -> Plot | None:
    """--xyz-x/-y/-z as a plot (None without them), its size checked against --xyz-max-cells."""
    axes = (args.xyz_x, args.xyz_y, args.xyz_z)
    return Plot.of(*axes, most=args.xyz_max_cells) if any(axes) else None


def check_out_folder(out: str, name: str) -> None:
    """`out` can become a folder that takes files: said before anything loads, since a run that finds out only when
    it writes has spent its load, compile and generation for nothing. Nothing is created: the folder itself is made
    when the run writes, so a run refused later leaves no empty folder behind. Its nearest existing folder takes a
    probe file (deleted at once): the permission bits alone call /proc, a read-only mount or any folder writable
    for root."""
    path = Path(out).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor) or str(p) == ".")
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        raise InvalidInput(f"{name} {out} {what}; name a folder instead.")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as exc:
        said = f" ({exc.strerror})" if exc.errno in _SAID_ERRNOS and exc.strerror else ""  # /proc's ENOENT misleads
        raise InvalidInput(f"{name} {out} cannot be written: {existing} takes no new files{said}.") from None


#: Why a folder takes no files, where the system's words help (permissions, a read-only or full disk).
_SAID_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}


def _hires_scales(args: argparse.Namespace, plot: Plot | None = None) -> tuple[float, ...]:
    """`--hires-scale X` (above 1) and a plot's Hires upscale values as the hires scales the CLI's engine compiles;
    () without them (a value that is not a number in range is parse_request's to refuse)."""
    try:
        asked = [float(getattr(args, "hires_scale", None) or 1)]
    except (TypeError, ValueError):
        asked = []
    for axis in plot.axes if plot is not None else ():
        if axis.axis.label == "Hires upscale":
            asked += axis.values
    return tuple(sorted({scale for scale in asked if 1 < scale <= FIELD["hires_scale"].high}))


def _unet_extras(args: argparse.Namespace) -> dict[str, bool]:
    """The engine settings that compile what `--freeu` and `--pag-scale` ask for (their values are parse_request's
    to check)."""
    extras = {"freeu_programs": bool(str(getattr(args, "freeu", "") or "").strip())}
    try:
        extras["pag"] = float(getattr(args, "pag_scale", None) or 0) > 0
    except (TypeError, ValueError):
        extras["pag"] = False
    return {name: True for name, on in extras.items() if on}


def _generate(args: argparse.Namespace, config: EngineConfig, request: Request, cells: list[Cell]) -> int:
    from .cluster.join_options import options_from_args
    from .host.compiling.compile_cache import CompileCounter
    from .startup import start

    if request.ignored:
        flags = ", ".join(FIELD[name].flag for name in request.ignored)
        print(f"warning: no classifier-free guidance: {flags} ignored", file=sys.stderr)
    began = time.perf_counter()
    started = start(config, options_from_args(args), precompiled=args.precompiled, only=request)
    cluster, generator = started.cluster, started.engine
    if started.precompiled is not None:  # which were loaded, which are compiled and why
        print(started.precompiled.summary(args.precompiled), file=sys.stderr)
    warmup_compiles = generator.compile_count
    if not cluster.is_leader:
        return cluster.follow(generator, json_summary=args.json)
    try:
        if cells:
            return _plot_out(args, cluster.lead(generator), cells, began)
        result = cluster.lead(generator).generate(request)
    finally:
        cluster.stop()
    paths = result.save_pngs(args.out)
    summary = {
        "images": [str(p) for p in paths],
        "seeds": result.seeds,
        "devices": generator.device_summary,
        "timings": {**generator.load_timings, **started.warmup, **{f"call_{k}": v for k, v in result.timings.items()}},
        "process_s": time.perf_counter() - began,
        "compiles": CompileCounter.compiles(),  # programs this process built, compiled or loaded from the cache
        "compilation_cache_hits": CompileCounter.cache_hits(),  # of those, loaded from the persistent cache
        "programs": generator.startup_programs.counts(),  # served programs: traced, compiled, cached, loaded, stored
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


def _plot_out(args: argparse.Namespace, engine, cells: list[Cell], began: float) -> int:
    """Run the plot's cells (contract/xyz_run.py) and write its grids (grid.png, or grid-<z>.png per Z value,
    replacing any there) and each cell's images (cell-<x>-<y>-<z>-00000.png, ...) into --out."""
    plot = _plot(args)
    outcome = run_plot(engine, plot, cells)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_grid = len(plot.x.values) * len(plot.y.values)
    titles = [cell.labels[2] for cell in outcome.cells[::per_grid]]  # each Z value's label ("" without a Z axis)
    grids = [save_png(grid, out / _grid_name(title)) for grid, title in zip(outcome.grids, titles, strict=True)]
    images = [
        path
        for cell, result in zip(outcome.cells, outcome.results, strict=True)
        if result is not None
        for path in result.save_pngs(out, "cell-" + "-".join(map(str, cell.position)))
    ]
    if args.json:
        summary = {"grids": [str(p) for p in grids], "images": [str(p) for p in images], "cells": len(cells)}
        print(json.dumps({**summary, "process_s": time.perf_counter() - began}, indent=2))
        return 0
    for path in (*grids, *images):
        print(path)
    print(f"X/Y/Z plot: {len(cells)} cells, {len(images)} images, in {time.perf_counter() - began:.1f} s")
    return 0


#: What a grid's file name keeps of its Z value: letters, digits and . + - (the rest become _).
_UNSAFE = re.compile(r"[^\w.+-]+")


def _grid_name(title: str) -> str:
    """grid.png, or grid-<z>.png for a Z value's grid ("Steps: 4" -> grid-4.png, "DPM++ 2M" -> grid-DPM++_2M.png)."""
    value = title.rpartition(": ")[2] if title else ""
    return f"grid-{_UNSAFE.sub('_', value)}.png" if value else "grid.png"


def request_arguments(args: argparse.Namespace) -> dict:
    """The request fields' flags (the table's, `fields.FIELDS`) as `parse_request`'s keywords."""
    given = {row.name: getattr(args, request_option(row).dest) for row in FIELDS if row.flag}
    randomize = str(given["seed"]).strip().lower() in ("random", "randomize")
    if given["seed"] is not None and not str(given["seed"]).strip():  # `--seed ""`: the page's sentence names a box
        raise InvalidInput(f"--seed is empty; give a whole number from 0 to {FIELD['seed'].high}, or --seed random.")
    if not randomize:
        try:
            resolve_seed(given["seed"])  # the request's own check, with the CLI's way to a random seed added
        except InvalidInput as exc:
            raise InvalidInput(f"{str(exc).removesuffix('.')} (pass --seed random for a random seed).") from None
    pictures = {
        name: GivenPath(given[name]) for name in ("init_image", "mask_image", "region_mask") if given[name] is not None
    }
    loras = [_lora(text) for text in given["loras"]]
    return {
        **given,
        **pictures,
        "seed": None if randomize else given["seed"],
        "randomize_seed": randomize,
        "loras": loras,
        "controlnets": control_units(args),
        "ip_images": image_prompt_units(args),
    }


def image_prompt_units(args: argparse.Namespace) -> list[dict]:
    """--ip-image FILE (repeated) with the i-th --ip-image-adapter, --ip-scale, --ip-start, --ip-end of each."""
    settings = {"adapter": "ip_image_adapter", "scale": "ip_scale", "start": "ip_start", "end": "ip_end"}
    return _per_image(args, "ip_image", settings, numbers=("scale", "start", "end"))


def control_units(args: argparse.Namespace) -> list[dict]:
    """--control-image FILE (repeated) with the i-th --control, --control-weight, ... of each as one unit."""
    settings = {
        "name": "control",
        "weight": "control_weight",
        "start": "control_start",
        "end": "control_end",
        "preprocessor": "control_preprocessor",
        "control_type": "control_type",
    }
    return _per_image(args, "control_image", settings, numbers=("weight", "start", "end"))


def _per_image(args: argparse.Namespace, images: str, settings: dict[str, str], numbers: tuple[str, ...]) -> list:
    """Each `images` FILE flag's item: the file and the i-th value of each `settings` flag (key -> its dest), the
    `numbers` among them read as numbers."""
    items = []
    for i, image in enumerate(getattr(args, images, None) or []):
        item = {"image": GivenPath(image)}  # the CLI's user names their own file
        for key, dest in settings.items():
            values = getattr(args, dest, None) or []
            if i < len(values):
                item[key] = _number(values[i], dest) if key in numbers else values[i]
        items.append(item)
    return items


def _number(text: str, dest: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(f"--{dest.replace('_', '-')} must be a number; got {text!r}.") from None


def _lora(text: str) -> list:
    """--lora NAME[:WEIGHT[:UNET_WEIGHT]] as the API's [name, weight] (or [name, te, unet]); weights checked later."""
    name, *weights = str(text).split(":")
    return [name, *weights] if weights else [name, 1.0]


def _precompile(args: argparse.Namespace) -> int:
    from .precompile import precompile

    started = time.perf_counter()
    manifest = precompile(engine_config(args), topology=args.topology, out=args.out, progress=print)
    print(
        f"{len(manifest['programs'])} programs for {manifest['device_count']} x {manifest['device_kind']} in "
        f"{args.out} ({time.perf_counter() - started:.0f} s)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("generate", "precompile", "serve"):
        check_env_choices(parser, args, {"generate": CLI, "precompile": PRECOMPILE, "serve": SERVE}[args.command])
    if args.command == "serve":
        logging.getLogger().setLevel(logging.INFO)  # its phases and its address, as the app logs them
    if args.command in ("generate", "serve") or (args.command == "precompile" and args.topology == "cpu"):
        use_cpu_cores(args.cpu_devices)  # before JAX is imported
    else:  # make-tiny; compiling for a TPU topology needs libtpu, not a TPU: no probe for one either way
        skip_absent_tpu()
    try:
        checked = _check(args) if args.command == "generate" else None  # before JAX is imported: bad input in a moment
        if args.command == "precompile":
            check_out_folder(args.out, "--out")
        elif args.command == "make-tiny":  # it replaces the folder it is given: never a file in its place
            check_out_folder(args.directory, "make-tiny's folder")
        if args.command == "serve":  # its model, LoRA and embeddings folders, as the app's
            check(engine_config(args))
        quiet_start()  # huggingface_hub's and Gradio's noise
        if args.command == "make-tiny":
            from .checkpoint.tiny import make_tiny

            print(make_tiny(args.directory, seed=args.seed))
            return 0
        if args.command == "precompile":
            return _precompile(args)
        if args.command == "serve":
            from .service.serving import serve

            return serve(args)
        return _generate(args, *checked)
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
