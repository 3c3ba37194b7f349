"""What an ESRGAN upscaler costs per picture on this machine: a 64² picture to 256² through `host/upscale_tiles.py`.

    python -m bench.features.esrgan_tiles                                   # the tiny ×4 test model, tile 64 (one tile)
    python -m bench.features.esrgan_tiles --model 4x-UltraSharp.pth --side 512 --tile 192 --repeats 5

The program is compiled first (untimed); then `upscale` (host tiling, the device program, the feathered blend,
uint8 back) runs `--repeats` times and the median, min and max wall times are printed, with the compilations
counted while timing (must be 0).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

TINY = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "esrgan" / "tiny-x4.safetensors"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(TINY), help="an RRDBNet .safetensors or .pth (default: the tiny ×4)")
    parser.add_argument("--side", type=int, default=64, help="the input picture's side in pixels")
    parser.add_argument("--tile", type=int, default=64, help="the tile's side in input pixels")
    parser.add_argument("--overlap", type=int, default=8, help="the tiles' overlap in input pixels")
    parser.add_argument("--batch", type=int, default=1, help="tiles per program call")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs")
    args = parser.parse_args(argv)

    import jax

    from ..engine import CompileCounter, TiledUpscaler, load_upscaler

    weights = load_upscaler(args.model)
    upscaler = TiledUpscaler(weights.module, weights.params, tile=args.tile, overlap=args.overlap, batch=args.batch)
    started = time.perf_counter()
    upscaler.compile()
    compile_s = time.perf_counter() - started
    image = (np.random.default_rng(0).random((args.side, args.side, 3)) * 255).astype(np.uint8)
    upscaler.upscale(image)  # untimed: the first run's transfers
    compiles = CompileCounter.compiles()
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        out = upscaler.upscale(image)
        seconds.append(time.perf_counter() - started)
    device = jax.devices()[0]
    print(
        f"{weights.name}: {args.side}² -> {out.shape[1]}×{out.shape[0]}, tile {args.tile} overlap {args.overlap} "
        f"batch {args.batch}, "
        f"{device.platform} ({device.device_kind}): median {statistics.median(seconds) * 1e3:.1f} ms, "
        f"min {min(seconds) * 1e3:.1f}, max {max(seconds) * 1e3:.1f} over {args.repeats}; compiled in "
        f"{compile_s:.1f} s; compiles while timing: {CompileCounter.compiles() - compiles}"
    )


if __name__ == "__main__":
    main()
