"""The UNet's spatial transformer: a feature map read as tokens, self-attention, cross-attention to the text, GEGLU.

SDXL's UNets project in and out with Dense layers (`use_linear_projection`); the 1x1-convolution form stays for
ControlNets whose config asks for it (the same numbers, a kernel of another shape).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from . import layers
from .attention import Attention
from .resnet import conv1x1


class GEGLU(nn.Module):
    """Dense to 2 x 4D, then one half times GELU (tanh approximation, as diffusers' Flax) of the other: -> [.., 4D]."""

    dim: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.proj = layers.Dense(self.dim * 4 * 2, dtype=self.dtype)

    def __call__(self, hidden_states):
        linear, gate = jnp.split(self.proj(hidden_states), 2, axis=2)
        return linear * nn.gelu(gate)


class FeedForward(nn.Module):
    """GEGLU then Dense back to D (diffusers' `net_0` / `net_2` names: `net_1` was a dropout)."""

    dim: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.net_0 = GEGLU(self.dim, self.dtype)
        self.net_2 = layers.Dense(self.dim, dtype=self.dtype)

    def __call__(self, hidden_states):
        return self.net_2(self.net_0(hidden_states))


class BasicTransformerBlock(nn.Module):
    """Pre-norm self-attention, cross-attention to the text, feed-forward, each with a residual: [B, L, D]."""

    dim: int
    n_heads: int
    d_head: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.attn1 = Attention(self.dim, self.n_heads, self.d_head, dtype=self.dtype)
        self.attn2 = Attention(self.dim, self.n_heads, self.d_head, dtype=self.dtype)
        self.ff = FeedForward(dim=self.dim, dtype=self.dtype)
        self.norm1 = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)
        self.norm2 = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)
        self.norm3 = layers.LayerNorm(epsilon=1e-5, dtype=self.dtype)

    def __call__(self, hidden_states, context):
        """hidden_states [B, L, D], context (the text) [B, T, Dt] -> [B, L, D]."""
        hidden_states = self.attn1(self.norm1(hidden_states)) + hidden_states
        hidden_states = self.attn2(self.norm2(hidden_states), context) + hidden_states
        return self.ff(self.norm3(hidden_states)) + hidden_states


class Transformer2DModel(nn.Module):
    """GroupNorm, a linear projection to tokens, `depth` transformer blocks, back to a map, plus the input."""

    in_channels: int
    n_heads: int
    d_head: int
    depth: int = 1
    use_linear_projection: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        inner_dim = self.n_heads * self.d_head
        project = layers.Dense if self.use_linear_projection else conv1x1
        self.norm = layers.GroupNorm(num_groups=32, epsilon=1e-5)
        self.proj_in = project(inner_dim, dtype=self.dtype)
        self.transformer_blocks = [
            BasicTransformerBlock(inner_dim, self.n_heads, self.d_head, dtype=self.dtype) for _ in range(self.depth)
        ]
        self.proj_out = project(inner_dim, dtype=self.dtype)

    def __call__(self, hidden_states, context):
        """hidden_states [B, H, W, C], context [B, T, Dt] -> [B, H, W, C]."""
        batch, height, width, channels = hidden_states.shape
        residual = hidden_states
        hidden_states = self.norm(hidden_states)
        if self.use_linear_projection:  # to tokens, then project
            hidden_states = self.proj_in(hidden_states.reshape(batch, height * width, channels))  # [B, HW, C]
        else:  # project the map, then to tokens
            hidden_states = self.proj_in(hidden_states).reshape(batch, height * width, channels)
        for block in self.transformer_blocks:
            hidden_states = block(hidden_states, context)
        if self.use_linear_projection:
            hidden_states = self.proj_out(hidden_states).reshape(batch, height, width, channels)
        else:
            hidden_states = self.proj_out(hidden_states.reshape(batch, height, width, channels))
        return hidden_states + residual
