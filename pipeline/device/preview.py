"""Live previews: a step's predicted clean latents -> small RGB images, without the VAE.

SDXL's latents map to RGB almost linearly, so a preview is one 4x3 projection plus a bias per pixel of the latent
grid (ComfyUI's "Latent2RGB" preview: the factors of `comfy/latent_formats.py`, class `SDXL`, applied as in
`latent_preview.py`'s `Latent2RGBPreviewer` and `preview_to_image`, Comfy-Org/ComfyUI). They apply to latents in the
UNet's scale (the VAE's latents times its scaling factor), which is the scale of the D that `step_local` returns.

    the `preview[size]` program (host/compiling/programs.py): float32 [B, 4, h, w] -> uint8 [B, h, w, 3] on the devices,
    so only h*w*3 bytes per image come back (49 KB at 1024²)

`latents_to_rgb_numpy` is the same maths on the host, as a reference (and for hosts that already hold the latents).
Each image is shown at latent resolution (1/8 of the final size per side) unless `scale` repeats its pixels; the
browser can scale a small image up for free, so scale 1 is what the host should bring back.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

#: SDXL's latent -> RGB factors, one row per latent channel: (R, G, B) (ComfyUI `latent_formats.SDXL`).
SDXL_LATENT_RGB = (
    (0.3651, 0.4232, 0.4341),
    (-0.2533, -0.0042, 0.1068),
    (0.1076, 0.1111, -0.0362),
    (-0.3165, -0.2492, -0.2188),
)
#: Added to every pixel after the projection (ComfyUI `latent_formats.SDXL.latent_rgb_factors_bias`).
SDXL_LATENT_RGB_BIAS = (0.1084, -0.0175, -0.0011)


def latents_to_rgb(latents, scale: int = 1):
    """Traced (jit-able) preview of predicted clean latents: float32 [B, 4, h, w] -> uint8 [B, h*scale, w*scale, 3].

    Written as four multiply-adds rather than an einsum: on TPU a float32 matmul runs at bfloat16 precision by
    default, and a 4-deep contraction gains nothing from the matrix unit. `scale` (static) repeats pixels.
    """
    latents = latents.astype(jnp.float32)
    factors = jnp.asarray(SDXL_LATENT_RGB, jnp.float32)  # [4, 3]
    rgb = jnp.asarray(SDXL_LATENT_RGB_BIAS, jnp.float32)  # [3], broadcast to [B, h, w, 3] by the first add
    for channel in range(factors.shape[0]):
        rgb = rgb + latents[:, channel, :, :, None] * factors[channel]  # [B, h, w, 3]
    pixels = jnp.round((jnp.clip(rgb, -1.0, 1.0) + 1.0) * 127.5).astype(jnp.uint8)  # [-1, 1] -> 0..255
    if scale > 1:
        pixels = jnp.repeat(jnp.repeat(pixels, scale, axis=1), scale, axis=2)
    return pixels


def latents_to_rgb_numpy(latents: np.ndarray, scale: int = 1) -> np.ndarray:
    """`latents_to_rgb` on the host, same float32 maths in the same order: [B, 4, h, w] -> uint8 [B, h', w', 3]."""
    latents = np.asarray(latents, np.float32)
    if latents.ndim != 4 or latents.shape[1] != len(SDXL_LATENT_RGB):
        raise ValueError(f"expected latents [B, 4, h, w]; got shape {latents.shape}")
    factors = np.asarray(SDXL_LATENT_RGB, np.float32)  # [4, 3]
    rgb = np.broadcast_to(np.asarray(SDXL_LATENT_RGB_BIAS, np.float32), (*latents[:, 0].shape, 3))  # [B, h, w, 3]
    for channel in range(factors.shape[0]):
        rgb = rgb + latents[:, channel, :, :, None] * factors[channel]
    pixels = np.round((np.clip(rgb, np.float32(-1), np.float32(1)) + np.float32(1)) * np.float32(127.5))
    pixels = pixels.astype(np.uint8)
    if scale > 1:
        pixels = pixels.repeat(scale, axis=1).repeat(scale, axis=2)
    return pixels
