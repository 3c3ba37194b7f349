"""Write tests/fixtures/engine-noise.npz: the engine's per-step noise, for the PyTorch references of its stochastic
samplers (DPM++ 2M SDE, LCM) to draw the same noise.

    /work/main/.venv/bin/python scripts/make_engine_noise.py      # JAX (the project's venv); before the torch script

Key `noise`: float32 [rows, 1, 4, 8, 8], row i = `sampler_update.ancestral_noise` of seed 0 at step index i, at the
tiny checkpoint's 64x64 latent size (what `tests/reference.run_local` draws with its default seeds).
tests/engine/test_a1111_samplers.py checks that the engine still draws exactly this.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "tests" / "fixtures" / "engine-noise.npz"
ROWS = 16
SHAPE = (4, 8, 8)


def engine_noise(rows: int = ROWS, shape: tuple = SHAPE) -> np.ndarray:
    from pipeline.device.sampler_update import ancestral_keys, ancestral_noise

    keys = ancestral_keys(np.zeros(1, np.uint32))
    return np.stack([np.asarray(ancestral_noise(keys, np.int32(i), shape)) for i in range(rows)])


if __name__ == "__main__":
    np.savez(OUT, noise=engine_noise())
    print(OUT)
