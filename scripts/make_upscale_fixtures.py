"""Makes tests/fixtures/upscale_modes.npz: torch.nn.functional.interpolate's numbers for A1111's latent upscalers.

Run in a separate torch environment (never by CI): `python scripts/make_upscale_fixtures.py`. A1111 upscales the
hires fix's latents with `interpolate(samples, size=(H/8, W/8), mode=..., antialias=...)`
(`shared.latent_upscale_modes`);
tests/engine/test_hires.py checks `pipeline/device/upscale.py` against these for each mode and target size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

MODES = {
    "bilinear": False,
    "bilinear-aa": True,
    "bicubic": False,
    "bicubic-aa": True,
    "nearest": False,
    "nearest-exact": False,
}
#: (source h, w) -> targets: the tiny checkpoint's 64 px latents (8) to 96 and 128 px, and an uneven pair.
SIZES = {(8, 8): [(12, 12), (16, 16)], (5, 7): [(11, 13)]}
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "upscale_modes.npz"


def main() -> None:
    rng = np.random.default_rng(47)
    arrays = {}
    for (h, w), targets in SIZES.items():
        source = rng.standard_normal((2, 4, h, w)).astype(np.float32)
        arrays[f"in_{h}x{w}"] = source
        for target in targets:
            for name, antialias in MODES.items():
                mode = name.removesuffix("-aa")
                out = torch.nn.functional.interpolate(
                    torch.from_numpy(source), size=target, mode=mode, antialias=antialias
                )
                arrays[f"out_{h}x{w}_{target[0]}x{target[1]}_{name}"] = out.numpy()
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({len(arrays)} arrays, torch {torch.__version__})")


if __name__ == "__main__":
    main()
