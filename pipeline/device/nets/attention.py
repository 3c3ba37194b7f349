"""The UNet's multi-head attention: projections to heads, the attention core, the output projection.

The core here is diffusers' own (scores and softmax in the compute dtype), the reference; the engine swaps only
the core through `device/attention.py`'s hook, which calls this module's `query`, `key`, `value` and `proj_attn`
layers, so the parameters are the same whichever core runs.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from . import layers
from .ip_attention import image_prompt_term


class Attention(nn.Module):
    """Self-attention (`context` None) or cross-attention to the text (and to an image prompt's tokens, within
    `ip_attention.image_tokens`): [B, Lq, D] -> [B, Lq, D]."""

    query_dim: int
    heads: int
    dim_head: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        inner_dim = self.heads * self.dim_head
        self.query = layers.Dense(inner_dim, use_bias=False, dtype=self.dtype, name="to_q")
        self.key = layers.Dense(inner_dim, use_bias=False, dtype=self.dtype, name="to_k")
        self.value = layers.Dense(inner_dim, use_bias=False, dtype=self.dtype, name="to_v")
        self.proj_attn = layers.Dense(self.query_dim, dtype=self.dtype, name="to_out_0")

    def __call__(self, hidden_states, context=None):
        context = hidden_states if context is None else context
        batch = hidden_states.shape[0]

        def split(x):  # [B, L, N*H] -> [B, L, N, H]
            return jnp.reshape(x, (batch, -1, self.heads, self.dim_head))

        q, k, v = split(self.query(hidden_states)), split(self.key(context)), split(self.value(context))
        scores = jnp.einsum("b t n h, b f n h -> b n f t", k, q) * self.dim_head**-0.5  # [B, N, Lq, Lk]
        probs = nn.softmax(scores, axis=-1)
        out = jnp.einsum("b n f t, b t n h -> b f n h", probs, v)  # [B, Lq, N, H]
        image = image_prompt_term(self, q) if context is not hidden_states else None  # IP-Adapter's, if any
        out = out if image is None else out + image
        return self.proj_attn(jnp.reshape(out, (batch, -1, self.heads * self.dim_head)))
