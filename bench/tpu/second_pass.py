"""`python -m bench tpu-second-pass`: the refiner and the 2048² hires pass compiled by the real TPU compiler (v5e:2x2).

    python -m bench tpu-second-pass                  # every program below, one after another (hours here)
    python -m bench tpu-second-pass --only "decode 2048x2048,decode 2048x2048 tiled"
    python -m bench tpu-second-pass --report         # the figures and predictions of --out/tpu_second_pass.json

As `python -m bench tpu` (bench/tpu/programs.py, same `compile_one`): SDXL base 1.0's and refiner 1.0's configs
(assets/sdxl_refiner_unet_config.json), abstract bf16 weights (shapes only), one image per chip, weights
replicated; each program `ServedPrograms.lower(key).compile()` for the topology. Programs:

    refiner_step 1024x1024 cfg     the refiner's step (splash attention, one 77-token window)
    step_full 2048x2048 cfg        the base's step at 2048² (the hires fix's second pass at scale 2; splash)
    decode / encode_image 2048x2048         the VAE whole (a server with --vae-tile-above above 2048²)
    decode / encode_image 2048x2048 tiled   the VAE in tiles (device/vae_tiles.py: 64² latents, 16 overlap)

XLA's cost analysis counts a while loop's body once, so a tiled program's FLOPs, bytes and roofline are its
loop body's (one tile's) × the tiles (25 at 2048²) in the report. A program the compiler refuses (e.g. out of
HBM) gets a row with its error. Rows go to --out/tpu_second_pass.json after each program (a long run keeps what it
finished). The report adds:
- HBM per chip with base and refiner resident: every weight (the base's UNet, text encoders and VAE, the refiner's
  UNet and CLIP-G; from their shapes) plus the largest non-argument bytes (temporaries, outputs, code) of any
  program compiled that such a server runs (the 2048² VAE tiled, as the default --vae-tile-above has it);
- predicted v5e-4 request times (4 images, one per chip) from the rooflines (lower bounds, as bench/tpu/programs.py's):
  base 25 steps + refiner at 0.8 (20 base steps, 5 refiner steps, decode) and 1024² -> 2048² hires at denoise 0.55
  (25 steps, decode, encode at 2048², `second_pass_steps(25, 0, 0.55)`: 25 steps at 2048², decode), with the
  1024² rows (encode, step_full, decode) taken from --out/tpu.json (`python -m bench tpu`).
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

from .programs import HBM_V5E, compile_one, sdxl_model

REFINER_CONFIG = Path(__file__).resolve().parents[2] / "assets" / "sdxl_refiner_unet_config.json"
TILED = " tiled"
#: label -> (kind, height, width, cfg, tiled); the order they are compiled in.
PROGRAMS = {
    "decode 2048x2048": ("decode", 2048, 2048, None, False),
    "decode 2048x2048 tiled": ("decode", 2048, 2048, None, True),
    "encode_image 2048x2048": ("encode_image", 2048, 2048, None, False),
    "encode_image 2048x2048 tiled": ("encode_image", 2048, 2048, None, True),
    "refiner_step 1024x1024 cfg": ("refiner_step", 1024, 1024, True, False),
    "step_full 2048x2048 cfg": ("step_full", 2048, 2048, True, False),
}
#: A v5e-4 request: steps, denoise and the refiner's switch (A1111: refiner at 0.8 of the steps).
STEPS, HIRES_DENOISE, REFINER_SWITCH = 25, 0.55, 0.8


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench tpu-second-pass",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--topology", default="v5e:2x2", help="TPU topology (default v5e:2x2 = v5e-4)")
    parser.add_argument("--only", default=None, help=f"labels, comma-separated (default all: {', '.join(PROGRAMS)})")
    parser.add_argument("--out", default="bench-results", help="directory of tpu_second_pass.json and tpu.json")
    parser.add_argument("--report", action="store_true", help="only the figures of tpu_second_pass.json")
    args = parser.parse_args(argv)
    args.labels = [label.strip() for label in args.only.split(",")] if args.only else list(PROGRAMS)
    unknown = set(args.labels) - set(PROGRAMS)
    if unknown:
        parser.error(f"--only takes some of: {', '.join(PROGRAMS)} (not {', '.join(sorted(unknown))})")
    return args


def with_refiner(dtype: str = "bfloat16"):
    """SDXL base's modules and abstract weights (bench/tpu/programs.sdxl_model) plus refiner 1.0's UNet and CLIP-G."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from ..engine import network

    modules, params = sdxl_model(dtype)
    unet = network("unet", json.loads(REFINER_CONFIG.read_text()), dtype)
    shapes = jax.eval_shape(unet.init_weights, jax.random.PRNGKey(0))
    refiner = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), shapes)
    modules = dataclasses.replace(modules, refiner_unet=unet, refiner_text_encoder_2=modules.text_encoder_2)
    return modules, {**params, "refiner_unet": refiner, "refiner_text_encoder_2": params["text_encoder_2"]}


def weight_bytes(params) -> dict[str, int]:
    """Bytes of each component's weights (per chip: replicated)."""
    import jax
    import numpy as np

    return {
        name: int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))
        for name, tree in params.items()
    }


def compile_rows(args, progress=print) -> list[dict]:
    from ..engine import ProgramKey, ServedPrograms, data_mesh, topology_devices

    modules, params = with_refiner()
    mesh = data_mesh(topology_devices(args.topology))
    out = Path(args.out) / "tpu_second_pass.json"
    rows = json.loads(out.read_text())["programs"] if out.exists() else []
    for label in args.labels:
        kind, height, width, cfg, tiled = PROGRAMS[label]
        attention = "splash" if "step" in kind else None
        programs = ServedPrograms(
            modules,
            params,
            mesh,
            attention=attention or "xla",
            levers=True,
            vae_tile_above=height * width - 1 if tiled else None,
        )
        key = ProgramKey(kind, height, width, cfg)
        started = time.perf_counter()
        try:
            row = compile_one(programs, key, attention, args.topology, progress)
        except Exception as exc:  # the compiler's refusal (e.g. out of HBM) is the figure
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
            progress(f"tpu-second-pass: {label} not compiled: {message[:300]}")
            row = {
                "program": key.label,
                "error": message,
                "topology": args.topology,
                "compile_s": round(time.perf_counter() - started, 1),
            }
            traceback.print_exc()
        row["program"] = label
        rows = [r for r in rows if r["program"] != label] + [row]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"programs": rows, "weights": weight_bytes(params)}, indent=1))
    return rows


def loop_trips(label: str) -> int:
    """The tiles a tiled program loops over (1 for the others): XLA's cost analysis counts a loop body once."""
    from ..engine import vae_tiles

    kind, height, width, _, tiled = PROGRAMS[label]
    return vae_tiles(height, width) if tiled else 1


def report(out_dir: Path) -> str:
    """The figures: per program HBM and roofline, HBM with both models resident, the predicted requests."""
    from ..engine import second_pass_steps

    data = json.loads((out_dir / "tpu_second_pass.json").read_text())
    rows = {r["program"]: r for r in data["programs"]}
    base_path = out_dir / "tpu.json"
    base = {r["program"]: r for r in json.loads(base_path.read_text())["programs"]} if base_path.exists() else {}
    base = {**{label: r for label, r in base.items() if r.get("attention") in (None, "splash")}}
    lines = ["program                              HBM/chip GiB   TFLOP   GB      roofline ms   compile s"]
    for label, row in rows.items():
        if "error" in row:
            lines.append(f"{label:36s} not compiled: {row['error'][:200]}")
            continue
        tiles = loop_trips(label)
        if tiles > 1:  # XLA's cost analysis counts a while loop's body once: the whole program is tiles × that
            row = {
                **row,
                "roofline_s": row["roofline_s"] * tiles,
                "flops": row["flops"] * tiles,
                "bytes_accessed": row["bytes_accessed"] * tiles,
            }
            rows[label] = row
        lines.append(
            f"{label:36s} {row['hbm_total_bytes'] / 2**30:8.2f}   {row['flops'] / 1e12:8.3f} "
            f"{row['bytes_accessed'] / 1e9:7.2f} {row['roofline_s'] * 1e3:10.2f}   {row['compile_s']:8.0f}"
            + (f"   ({tiles} tiles x the loop body's cost)" if tiles > 1 else "")
        )
    weights = data["weights"]
    resident = sum(weights.values())
    # a server with the default --vae-tile-above runs the 2048² VAE tiled, not these
    whole_vae = {label for label, (kind, *_, tiled) in PROGRAMS.items() if "step" not in kind and not tiled}
    compiled = [r for label, r in [*rows.items(), *base.items()] if "hbm_bytes" in r and label not in whole_vae]
    peak = max(compiled, key=lambda r: r["hbm_total_bytes"] - r["hbm_bytes"]["arguments"])
    working = peak["hbm_total_bytes"] - peak["hbm_bytes"]["arguments"]
    lines.append(
        f"weights per chip: {', '.join(f'{k} {v / 2**30:.2f}' for k, v in weights.items())} GiB; "
        f"all {resident / 2**30:.2f} GiB"
    )
    lines.append(
        f"base + refiner resident, peak: {(resident + working) / 2**30:.2f} GiB of {HBM_V5E / 2**30:.0f} "
        f"(+ {working / 2**30:.2f} GiB working set of {peak['program']})"
    )

    def roof(label, table=rows):
        row = table.get(label)
        return row["roofline_s"] if row and "roofline_s" in row else None

    parts = {
        "encode": roof("encode cfg", base),
        "step": roof("step_full 1024x1024 cfg", base),
        "decode": roof("decode 1024x1024", base),
        "refiner": roof("refiner_step 1024x1024 cfg"),
        "big step": roof("step_full 2048x2048 cfg"),
        "big decode": roof("decode 2048x2048 tiled"),
        "big encode": roof("encode_image 2048x2048 tiled"),
    }
    refined = round(STEPS * REFINER_SWITCH)
    schedule, second = second_pass_steps(STEPS, 0, HIRES_DENOISE)  # hires steps 0: the first pass's (A1111)
    requests = {
        f"base {refined} steps + refiner {STEPS - refined} steps (refiner at {REFINER_SWITCH})": (
            "encode",
            1,
            "step",
            refined,
            "refiner",
            STEPS - refined,
            "decode",
            1,
        ),
        f"1024² -> 2048² hires, denoise {HIRES_DENOISE}: {STEPS} + {second} steps (of a {schedule}-step schedule)": (
            "encode",
            1,
            "step",
            STEPS,
            "decode",
            1,
            "big encode",
            1,
            "big step",
            second,
            "big decode",
            1,
        ),
    }
    for name, plan in requests.items():
        counts = dict(zip(plan[::2], plan[1::2], strict=True))
        missing = [part for part in counts if parts[part] is None]
        if missing:
            lines.append(f"{name}: not predicted ({', '.join(missing)} not compiled)")
            continue
        seconds = sum(parts[part] * n for part, n in counts.items())
        lines.append(
            f"{name}: {seconds:.2f} s per request of 4 images on v5e-4 (roofline; "
            + ", ".join(f"{n} x {part} {parts[part] * 1e3:.1f} ms" for part, n in counts.items())
            + ")"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.report:
        from .cost import libtpu_available

        if not libtpu_available():
            print('tpu-second-pass needs libtpu: pip install "jax[tpu]==0.10.2"')
            return 2
        compile_rows(args)
    print(report(Path(args.out)))
    return 0
