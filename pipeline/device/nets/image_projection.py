"""IP-Adapter's image projections: an image encoder's output -> image tokens the UNet's cross-attention reads.

Two kinds, as h94/IP-Adapter publishes them (`ip_adapter/ip_adapter.py`, `ip_adapter/resampler.py`); parameter
names are the files' own (`image_proj.*`), so a file loads without renaming beyond PyTorch's kernel layout:
- `ImageProjModel` (ip-adapter_sdxl, ip-adapter_sdxl_vit-h): the projected image embedding [B, P] -> one Dense to
  `tokens` x cross_attention_dim, LayerNorm per token -> [B, 4, C]. diffusers' `ImageProjection`.
- `Resampler` (ip-adapter-plus*): a perceiver over the encoder's penultimate hidden states [B, patches, D]:
  `num_queries` learned latents attend to the patches and to themselves, `depth` times, then to C and normed ->
  [B, 16, C]. diffusers' `IPAdapterPlusImageProjection`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers


@dataclasses.dataclass(frozen=True)
class ImageProjectionConfig:
    """An adapter's projection, read off its weights' shapes (`checkpoint/ip_adapter_loading.py`)."""

    kind: str  # "plain" (ImageProjModel) or "plus" (Resampler)
    embed_dim: int  # what it reads: the encoder's projection_dim (plain) or hidden_size (plus)
    cross_attention_dim: int  # the UNet's: each token's width
    tokens: int  # 4 (plain) or num_queries (plus: 16)
    width: int = 0  # plus: the latents' width (1280 in SDXL's Plus adapters)
    heads: int = 0  # plus: attention heads of 64 each (h94's dim_head)
    depth: int = 0  # plus: perceiver layers
    ff_mult: int = 4  # plus: the feed-forward's expansion

    @property
    def reads_hidden_states(self) -> bool:
        """Plus reads the penultimate hidden states; plain the projected image embedding."""
        return self.kind == "plus"


class ImageProjModel(nn.Module):
    """[B, P] -> [B, tokens, C]."""

    config: ImageProjectionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.proj = layers.Dense(self.config.tokens * self.config.cross_attention_dim, dtype=self.dtype)
        self.norm = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)

    def __call__(self, embeds):
        tokens = self.proj(embeds).reshape(embeds.shape[0], self.config.tokens, self.config.cross_attention_dim)
        return self.norm(tokens)


class PerceiverAttention(nn.Module):
    """The latents attend to the image's tokens and to themselves: (x [B, N, W], latents [B, Q, W]) -> [B, Q, W]."""

    width: int
    heads: int
    dim_head: int = 64
    dtype: Any = jnp.float32

    def setup(self) -> None:
        inner = self.heads * self.dim_head
        self.norm1 = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)
        self.norm2 = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)
        self.to_q = layers.Dense(inner, use_bias=False, dtype=self.dtype)
        self.to_kv = layers.Dense(inner * 2, use_bias=False, dtype=self.dtype)
        self.to_out = layers.Dense(self.width, use_bias=False, dtype=self.dtype)

    def __call__(self, x, latents):
        x, latents = self.norm1(x), self.norm2(latents)
        batch = x.shape[0]

        def heads(t):  # [B, L, N*H] -> [B, N, L, H]
            return t.reshape(batch, -1, self.heads, self.dim_head).transpose(0, 2, 1, 3)

        q = heads(self.to_q(latents))
        k, v = (heads(t) for t in jnp.split(self.to_kv(jnp.concatenate([x, latents], axis=1)), 2, axis=-1))
        scale = self.dim_head**-0.25  # on q and on k, as h94's Resampler (more stable in fp16 than on one)
        weights = jax.nn.softmax(((q * scale) @ (k * scale).transpose(0, 1, 3, 2)).astype(jnp.float32), axis=-1)
        out = weights.astype(v.dtype) @ v  # [B, N, Q, H]
        return self.to_out(out.transpose(0, 2, 1, 3).reshape(batch, -1, self.heads * self.dim_head))


class FeedForward(nn.Module):
    """LayerNorm, Dense x ff_mult, exact GELU, Dense back (h94's Sequential: "0", "1", "3"; "2" is the GELU)."""

    width: int
    mult: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.norm = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype, name="0")
        self.up = layers.Dense(self.width * self.mult, use_bias=False, dtype=self.dtype, name="1")
        self.down = layers.Dense(self.width, use_bias=False, dtype=self.dtype, name="3")

    def __call__(self, x):
        return self.down(nn.gelu(self.up(self.norm(x)), approximate=False))


class PerceiverLayer(nn.Module):
    """h94's `layers[i]`: ("0": the attention, "1": the feed-forward), each with a residual on the latents."""

    config: ImageProjectionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.attention = PerceiverAttention(self.config.width, self.config.heads, dtype=self.dtype, name="0")
        self.ff = FeedForward(self.config.width, self.config.ff_mult, dtype=self.dtype, name="1")

    def __call__(self, x, latents):
        latents = self.attention(x, latents) + latents
        return self.ff(latents) + latents


class Resampler(nn.Module):
    """[B, patches, D] -> [B, num_queries, C]."""

    config: ImageProjectionConfig
    dtype: Any = jnp.float32

    def setup(self) -> None:
        config = self.config
        self.latents = self.param(
            "latents", jax.nn.initializers.normal(config.width**-0.5), (1, config.tokens, config.width)
        )
        self.proj_in = layers.Dense(config.width, dtype=self.dtype)
        self.layers = [PerceiverLayer(config, dtype=self.dtype, name=f"layers_{i}") for i in range(config.depth)]
        self.proj_out = layers.Dense(config.cross_attention_dim, dtype=self.dtype)
        self.norm_out = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)

    def __call__(self, hidden_states):
        x = self.proj_in(hidden_states)
        latents = jnp.broadcast_to(self.latents.astype(x.dtype), (x.shape[0], *self.latents.shape[1:]))
        for layer in self.layers:
            latents = layer(x, latents)
        return self.norm_out(self.proj_out(latents))


def image_projection(config: ImageProjectionConfig, dtype: Any = jnp.float32) -> nn.Module:
    """The projection module of `config.kind`."""
    return (Resampler if config.reads_hidden_states else ImageProjModel)(config, dtype=dtype)


def init_projection(module: nn.Module, rng) -> dict:
    """Parameters for `module`'s shapes (the loader traces this with `jax.eval_shape`)."""
    config = module.config
    width = config.embed_dim
    example = jnp.zeros((1, 5, width) if config.reads_hidden_states else (1, width), jnp.float32)
    return module.init(rng, example)["params"]
