"""What ControlNet Union, PAG, FreeU, regional prompts, outpainting, inpaint only masked and the X/Y/Z plot cost per
request on this machine, as multiples of a plain request (issues 67 and 69).

    python -m bench.features.composition                          # tiny-pt + the fixture ControlNets, 64², 4 steps
    python -m bench.features.composition --devices 1 --repeats 30

One engine serves them all (no speed levers, one prompt window, no previews). Each case runs once untimed (its
programs compile then), then every case once per round, `--repeats` rounds, interleaved (bench.common's
`interleaved_seconds`); the medians are printed.
Then a 4×4 plot (Steps 2-5 × CFG Scale 3-9) against its 16 cells sent one by one, with the compilations counted while
timing (must be 0). At 64² a request's fixed cost is most of its time: the figures say what each feature adds to the
launches, not what it costs at SDXL's size (bench tpu's rooflines do).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from ..common import configure_platform, interleaved_seconds, timed

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
PROMPT = "a red fox in the snow"


def cases(tile: Path) -> dict[str, tuple[str, dict]]:
    """(prompt, request fields) per case; guidance 5 unless a case says otherwise."""
    canny = {"name": "controlnet-union", "image": FIXTURES / "controlnet-map-a.png", "control_type": "canny"}
    picture = {"init_image": FIXTURES / "image-input.png", "strength": 0.75}
    masked = {**picture, "mask_image": FIXTURES / "image-mask.png"}
    return {
        "plain": (PROMPT, {}),
        "ControlNet": (PROMPT, {"controlnets": [{"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png"}]}),
        "union, 1 condition": (PROMPT, {"controlnets": [canny]}),
        "union, 2 conditions": (PROMPT, {"controlnets": [canny, {**canny, "image": tile, "control_type": "tile"}]}),
        "PAG, CFG": (PROMPT, {"pag_scale": 3.0}),
        "plain, no CFG": (PROMPT, {"guidance_scale": 1.0}),
        "PAG, no CFG": (PROMPT, {"guidance_scale": 1.0, "pag_scale": 3.0}),
        "FreeU": (PROMPT, {"freeu": "1.3,1.4,0.9,0.2"}),
        "regions, 2 parts": ("a red fox BREAK a blue lake", {"regions": "columns 1,1"}),
        "regions, 4 parts": ("a fox BREAK a lake BREAK a tree BREAK a hill", {"regions": "columns 1,1,1,1"}),
        "inpainting": (PROMPT, masked),
        "inpaint only masked": (PROMPT, {**masked, "inpaint_area": "Only masked"}),
        "outpainting": (PROMPT, {"init_image": FIXTURES / "image-input.png", "outpaint": "left=16 right=16"}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2, help="CPU devices (XLA's host platform device count)")
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds")
    args = parser.parse_args(argv)

    configure_platform(args.devices)
    import jax  # heavy: after XLA_FLAGS is set (the CPU device count is read when JAX starts)

    from ..engine import Generator, Plot, parse_request, run_plot  # heavy: imports JAX

    engine = Generator.from_pretrained(
        str(FIXTURES / "tiny-pt"),
        devices=jax.devices()[: args.devices],
        height=64,
        width=64,
        steps=4,
        dtype="float32",
        prompt_windows=1,
        previews=False,
        speed_levers=False,
        controlnets=(str(FIXTURES / "controlnet-a"), str(FIXTURES / "controlnet-union")),
        controlnet_units=2,
        pag=True,
        freeu_programs=True,
        region_parts=(2, 4),
    )
    with tempfile.TemporaryDirectory(prefix="composition-") as folder:
        tile = Path(folder) / "tile.png"
        Image.fromarray(np.load(FIXTURES / "image-expected.npz")["fit_image"]).save(tile)
        requests = {
            name: engine.request(prompt, seed=3, guidance_scale=fields.pop("guidance_scale", 5.0), **fields)
            for name, (prompt, fields) in cases(tile).items()
        }
        seconds, compiles = interleaved_seconds(engine, requests, args.repeats)  # each once untimed, then rounds
    plain = statistics.median(seconds["plain"])
    print(f"tiny-pt, 64², 4 steps, {args.devices} × {jax.devices()[0].platform}; medians of {args.repeats}:")
    for name, values in seconds.items():
        print(f"  {name:22s} {statistics.median(values) * 1e3:8.1f} ms  ({statistics.median(values) / plain:.2f}×)")
    plot = Plot.of("Steps: 2,3,4,5", "CFG Scale: 3,5,7,9")
    cells = plot.cells({"prompt": PROMPT, "seed": 3}, lambda f: parse_request(**f, rules=engine.rules), model="tiny")
    for cell in cells:
        engine.generate(cell.request)  # untimed
    before = engine.compile_count
    plot_s, _ = timed(lambda: run_plot(engine, plot, cells))
    single_s, _ = timed(lambda: [engine.generate(cell.request) for cell in cells])
    print(f"  4×4 plot {plot_s:.2f} s, its 16 cells one by one {single_s:.2f} s ({plot_s / single_s:.2f}×)")
    print(f"compiles while timing: {compiles + engine.compile_count - before}")


if __name__ == "__main__":
    main()
