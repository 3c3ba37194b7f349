"""The UNet's resnet block and its 2x down/up sampling convolutions (NHWC, as the whole UNet runs)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers


def conv3x3(channels: int, dtype, strides: int = 1, name: str | None = None) -> layers.Conv:
    """A 3x3 convolution padded by one pixel (SDXL's every spatial convolution)."""
    return layers.Conv(channels, (3, 3), strides=(strides, strides), padding=((1, 1), (1, 1)), dtype=dtype, name=name)


def conv1x1(channels: int, dtype, name: str | None = None) -> layers.Conv:
    """A 1x1 convolution: a per-pixel Dense (shortcuts, VAE's quant convs), kept a Conv for the tree's shapes."""
    return layers.Conv(channels, (1, 1), strides=(1, 1), padding="VALID", dtype=dtype, name=name)


class ResnetBlock2D(nn.Module):
    """GroupNorm(32) -> SiLU -> conv, plus the time embedding, twice; a 1x1 shortcut when the width changes.

    The GroupNorms take no dtype (as diffusers'): they compute in the input's and parameters' dtype.
    """

    in_channels: int
    out_channels: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.norm1 = layers.GroupNorm(num_groups=32, epsilon=1e-5)
        self.conv1 = conv3x3(self.out_channels, self.dtype)
        self.time_emb_proj = layers.Dense(self.out_channels, dtype=self.dtype)
        self.norm2 = layers.GroupNorm(num_groups=32, epsilon=1e-5)
        self.conv2 = conv3x3(self.out_channels, self.dtype)
        self.conv_shortcut = conv1x1(self.out_channels, self.dtype) if self.in_channels != self.out_channels else None

    def __call__(self, hidden_states, temb):
        """hidden_states [B, H, W, Cin], temb [B, T] -> [B, H, W, Cout]."""
        residual = hidden_states
        hidden_states = self.conv1(nn.swish(self.norm1(hidden_states)))
        temb = self.time_emb_proj(nn.swish(temb))  # [B, Cout]
        hidden_states = hidden_states + temb[:, None, None, :]
        hidden_states = self.conv2(nn.swish(self.norm2(hidden_states)))
        if self.conv_shortcut is not None:
            residual = self.conv_shortcut(residual)
        return hidden_states + residual


class Downsample2D(nn.Module):
    """A stride-2 3x3 convolution: [B, H, W, C] -> [B, H/2, W/2, C]."""

    out_channels: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.conv = conv3x3(self.out_channels, self.dtype, strides=2)

    def __call__(self, hidden_states):
        return self.conv(hidden_states)


class Upsample2D(nn.Module):
    """Nearest-neighbour 2x, then a 3x3 convolution: [B, H, W, C] -> [B, 2H, 2W, C]."""

    out_channels: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.conv = conv3x3(self.out_channels, self.dtype)

    def __call__(self, hidden_states):
        batch, height, width, channels = hidden_states.shape
        hidden_states = jax.image.resize(hidden_states, (batch, height * 2, width * 2, channels), method="nearest")
        return self.conv(hidden_states)
