"""The hires fix's latent upscalers: torch.nn.functional.interpolate's modes as A1111 calls them, in JAX.

A1111 upscales the first pass's latents with `interpolate(samples, size=(H/8, W/8), mode=..., antialias=...)`
(align_corners left at its default, False). Each mode is separable, so it is one fixed [out, in] matrix per axis,
built here in NumPy from torch's own index rules (aten's UpSample*.cpp) when the program is traced, and applied as
two contractions: exact to float32 rounding (tests/engine/test_hires.py against `scripts/make_upscale_fixtures.py`'s
numbers from torch).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

#: torch's cubic convolution coefficient (aten's upsample_bicubic2d); its antialiased bicubic uses Keys' -0.5.
CUBIC_A = -0.75
CUBIC_A_ANTIALIAS = -0.5


def _cubic(x: float, a: float) -> float:
    x = abs(x)
    if x <= 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def resize_matrix(size_in: int, size_out: int, mode: str, antialias: bool = False) -> np.ndarray:
    """float64 [size_out, size_in]: output sample i = Σ_j M[i, j]·input j along one axis, as torch computes it for
    `interpolate(..., size=size_out, mode=mode, antialias=antialias, align_corners=False)`."""
    scale = size_in / size_out  # torch's area_pixel_compute_scale with an output size given
    matrix = np.zeros((size_out, size_in))
    if antialias and mode in ("bilinear", "bicubic"):  # aten's _upsample_*_aa: a normalised filter of support ≥ 1
        support = (1.0 if mode == "bilinear" else 2.0) * max(scale, 1.0)
        inverse = 1.0 / scale if scale >= 1.0 else 1.0
        for i in range(size_out):
            center = scale * (i + 0.5)
            low = max(int(center - support + 0.5), 0)
            high = min(int(center + support + 0.5), size_in)
            taps = [(j - center + 0.5) * inverse for j in range(low, high)]
            weights = [max(0.0, 1.0 - abs(t)) if mode == "bilinear" else _cubic(t, CUBIC_A_ANTIALIAS) for t in taps]
            total = sum(weights)
            for j, weight in zip(range(low, high), weights, strict=True):
                matrix[i, j] = weight / total if total else 0.0
        return matrix
    for i in range(size_out):
        if mode == "nearest":  # floor(i · scale): aten's nearest_idx
            matrix[i, min(int(math.floor(i * scale)), size_in - 1)] = 1.0
        elif mode == "nearest-exact":  # floor((i + 0.5) · scale)
            matrix[i, min(int(math.floor((i + 0.5) * scale)), size_in - 1)] = 1.0
        elif mode == "bilinear":  # source clamped at 0; the right neighbour clamped to the last
            source = max(scale * (i + 0.5) - 0.5, 0.0)
            left = min(int(source), size_in - 1)
            right = min(left + 1, size_in - 1)
            t = source - left
            matrix[i, left] += 1.0 - t
            matrix[i, right] += t
        elif mode == "bicubic":  # source not clamped; the four taps clamped to the edges
            source = scale * (i + 0.5) - 0.5
            base = int(math.floor(source))
            t = source - base
            for k, weight in zip(
                range(-1, 3),
                (_cubic(t + 1, CUBIC_A), _cubic(t, CUBIC_A), _cubic(1 - t, CUBIC_A), _cubic(2 - t, CUBIC_A)),
                strict=True,
            ):
                matrix[i, min(max(base + k, 0), size_in - 1)] += weight
        else:
            raise ValueError(f"unknown interpolation mode {mode!r}")
    return matrix


def upscale_local(latents, *, height: int, width: int, mode: str, antialias: bool):
    """float32 [b, c, h, w] -> [b, c, height, width], as torch's interpolate(mode, antialias)."""
    rows = jnp.asarray(resize_matrix(latents.shape[2], height, mode, antialias), jnp.float32)  # [H, h]
    columns = jnp.asarray(resize_matrix(latents.shape[3], width, mode, antialias), jnp.float32)  # [W, w]
    return jnp.einsum(
        "Hh,bchw,Ww->bcHW", rows, latents.astype(jnp.float32), columns, precision=jax.lax.Precision.HIGHEST
    )
