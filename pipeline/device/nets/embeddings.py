"""Timestep embeddings: the sinusoid of a (fractional) timestep or of a size condition, and the MLP over it."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from . import layers


def sinusoidal(timesteps, dim: int, flip_sin_to_cos: bool, freq_shift: float):
    """timesteps [N] -> [N, dim]: half cosines, half sines (SDXL flips to cosine first), periods up to 10^4."""
    half = dim // 2
    step = math.log(1.0e4) / (half - freq_shift)
    frequencies = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -step)  # [dim/2]
    angles = jnp.expand_dims(timesteps, 1) * jnp.expand_dims(frequencies, 0)  # [N, dim/2]
    parts = [jnp.cos(angles), jnp.sin(angles)] if flip_sin_to_cos else [jnp.sin(angles), jnp.cos(angles)]
    return jnp.reshape(jnp.concatenate(parts, axis=1), [timesteps.shape[0], dim])


class Timesteps(nn.Module):
    """No parameters: `sinusoidal` as a module, so the UNet's tree keeps diffusers' `time_proj` slot."""

    dim: int
    flip_sin_to_cos: bool = True
    freq_shift: float = 0

    def __call__(self, timesteps):
        return sinusoidal(timesteps, self.dim, self.flip_sin_to_cos, self.freq_shift)


class TimestepEmbedding(nn.Module):
    """Two Dense layers with SiLU between: the sinusoid -> the embedding every resnet adds ([N, 4 x C0])."""

    time_embed_dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, temb):
        temb = layers.Dense(self.time_embed_dim, dtype=self.dtype, name="linear_1")(temb)
        return layers.Dense(self.time_embed_dim, dtype=self.dtype, name="linear_2")(nn.silu(temb))


def sdxl_conditioning(module: nn.Module, timesteps, text_embeds, time_ids):
    """SDXL's embedding of a step: the timestep's MLP plus the `text_time` add-embedding (pooled text and size ids),
    [B, 4 x C0]. `module` is the UNet or a ControlNet: both name the parts `time_proj`, `time_embedding`,
    `add_time_proj` and `add_embedding`."""
    time_embeds = module.add_time_proj(jnp.ravel(time_ids)).reshape((text_embeds.shape[0], -1))  # [B, ids x A]
    emb = module.time_embedding(module.time_proj(timesteps))  # [B, 4 x C0]
    return emb + module.add_embedding(jnp.concatenate([text_embeds, time_embeds], axis=-1))
