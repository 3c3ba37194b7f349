"""The VAE on the device: final latents -> uint8 pixels (so only 8-bit images leave the device), and a user's image
-> latents for image to image and inpainting (the posterior's mean: deterministic, diffusers' `sample_mode="argmax"`).
"""

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


def encode_local(modules: Modules, params, pixels, keep):
    """The VAE encoder to its posterior's mean × scaling factor: uint8 [b, H, W, 3], keep bool [b, H, W] (False
    pixels are grey, as a 9-channel inpainting UNet's masked image is) -> float32 [b, 4, H/8, W/8].

    Pixels in [-1, 1] as diffusers' image processor makes them (level / 255 · 2 - 1).
    """
    vae = modules.vae
    image = 2.0 * (pixels.astype(jnp.float32) / 255.0) - 1.0  # [b, H, W, 3]
    image = (image * keep.astype(jnp.float32)[..., None]).transpose(0, 3, 1, 2)  # [b, 3, H, W]
    posterior = vae.apply({"params": params["vae"]}, image.astype(vae.dtype), method=vae.encode).latent_dist
    return posterior.mean.astype(jnp.float32).transpose(0, 3, 1, 2) * vae.config.scaling_factor  # NHWC -> NCHW
