"""The VAE on the device: final latents -> uint8 pixels, so only 8-bit images leave the device."""

from __future__ import annotations

import jax.numpy as jnp

from .modules import Modules


def decode(modules: Modules, params, latents):
    """VAE decode to pixels in [0, 1]: float32 [b, H, W, 3]."""
    latents = latents / modules.vae.config.scaling_factor
    image = modules.vae.apply({"params": params["vae"]}, latents, method=modules.vae.decode).sample
    return (image / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1).astype(jnp.float32)


def to_uint8(image):
    """[0, 1] floats -> uint8, rounding to nearest (4x fewer bytes to bring back to the host)."""
    return jnp.round(image * 255).astype(jnp.uint8)


def decode_local(modules: Modules, params, latents):
    """VAE decode of the final latents: float32 [b, 4, h, w] -> uint8 [b, H, W, 3]."""
    return to_uint8(decode(modules, params, latents))
