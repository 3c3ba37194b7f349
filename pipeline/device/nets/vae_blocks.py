"""The VAE's pieces: a resnet without time embedding, one single-head self-attention, the 2x samplers, the blocks.

They differ from the UNet's in small ways the weights depend on: GroupNorm epsilon 1e-6 and `norm_num_groups`
groups, the downsampler pads only the bottom and right edge, the attention keeps diffusers' `query`/`key`/`value`/
`proj_attn` names.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from . import layers
from .resnet import Upsample2D, conv1x1, conv3x3


class VAEResnetBlock2D(nn.Module):
    """GroupNorm -> SiLU -> conv, twice, plus the input (through a 1x1 conv when the width changes)."""

    in_channels: int
    out_channels: int
    groups: int = 32
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.norm1 = layers.GroupNorm(num_groups=self.groups, epsilon=1e-6)
        self.conv1 = conv3x3(self.out_channels, self.dtype)
        self.norm2 = layers.GroupNorm(num_groups=self.groups, epsilon=1e-6)
        self.conv2 = conv3x3(self.out_channels, self.dtype)
        self.conv_shortcut = conv1x1(self.out_channels, self.dtype) if self.in_channels != self.out_channels else None

    def __call__(self, hidden_states):
        """[B, H, W, Cin] -> [B, H, W, Cout]."""
        residual = hidden_states
        hidden_states = self.conv1(nn.swish(self.norm1(hidden_states)))
        hidden_states = self.conv2(nn.swish(self.norm2(hidden_states)))
        if self.conv_shortcut is not None:
            residual = self.conv_shortcut(residual)
        return hidden_states + residual


class VAEAttentionBlock(nn.Module):
    """One-head self-attention over all pixels (the VAE's middle block), plus the input: [B, H, W, C]."""

    channels: int
    num_groups: int = 32
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.group_norm = layers.GroupNorm(num_groups=self.num_groups, epsilon=1e-6)
        self.query = layers.Dense(self.channels, dtype=self.dtype)
        self.key = layers.Dense(self.channels, dtype=self.dtype)
        self.value = layers.Dense(self.channels, dtype=self.dtype)
        self.proj_attn = layers.Dense(self.channels, dtype=self.dtype)

    def __call__(self, hidden_states):
        residual = hidden_states
        batch, height, width, channels = hidden_states.shape
        hidden_states = self.group_norm(hidden_states).reshape((batch, height * width, channels))  # [B, HW, C]

        def one_head(x):  # [B, HW, C] -> [B, 1, HW, C]
            return jnp.transpose(x.reshape(x.shape[:-1] + (1, -1)), (0, 2, 1, 3))

        query = one_head(self.query(hidden_states))
        key = one_head(self.key(hidden_states))
        value = one_head(self.value(hidden_states))
        scale = 1 / math.sqrt(math.sqrt(self.channels))  # on both q and k: 1/sqrt(C) in all
        weights = nn.softmax(jnp.einsum("...qc,...kc->...qk", query * scale, key * scale), axis=-1)  # [B, 1, HW, HW]
        hidden_states = jnp.transpose(jnp.einsum("...kc,...qk->...qc", value, weights), (0, 2, 1, 3))
        hidden_states = self.proj_attn(hidden_states.reshape(hidden_states.shape[:-2] + (self.channels,)))
        return hidden_states.reshape((batch, height, width, channels)) + residual


class VAEDownsample2D(nn.Module):
    """Pad one row and column at the bottom and right, then a stride-2 3x3 convolution: [B, H/2, W/2, C]."""

    in_channels: int
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.conv = layers.Conv(self.in_channels, (3, 3), strides=(2, 2), padding="VALID", dtype=self.dtype)

    def __call__(self, hidden_states):
        return self.conv(jnp.pad(hidden_states, pad_width=((0, 0), (0, 1), (0, 1), (0, 0))))


def _resnets(block) -> list[VAEResnetBlock2D]:
    """A block's `num_layers` resnets: the first changes the width, the others keep it."""
    widths = [block.in_channels] + [block.out_channels] * (block.num_layers - 1)
    return [VAEResnetBlock2D(c, block.out_channels, groups=block.resnet_groups, dtype=block.dtype) for c in widths]


class DownEncoderBlock2D(nn.Module):
    """`num_layers` resnets, then the downsampler unless it is the last block."""

    in_channels: int
    out_channels: int
    num_layers: int = 2
    resnet_groups: int = 32
    add_downsample: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = _resnets(self)
        if self.add_downsample:
            self.downsamplers_0 = VAEDownsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states):
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states)
        return self.downsamplers_0(hidden_states) if self.add_downsample else hidden_states


class UpDecoderBlock2D(nn.Module):
    """`num_layers` resnets, then a 2x upsampler unless it is the last block."""

    in_channels: int
    out_channels: int
    num_layers: int = 3
    resnet_groups: int = 32
    add_upsample: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = _resnets(self)
        if self.add_upsample:
            self.upsamplers_0 = Upsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states):
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states)
        return self.upsamplers_0(hidden_states) if self.add_upsample else hidden_states


class VAEMidBlock2D(nn.Module):
    """resnet, attention, resnet at the VAE's bottom (both encoder and decoder)."""

    in_channels: int
    resnet_groups: int = 32
    dtype: Any = jnp.float32

    def setup(self) -> None:
        channels, groups = self.in_channels, self.resnet_groups
        self.resnets = [VAEResnetBlock2D(channels, channels, groups=groups, dtype=self.dtype) for _ in range(2)]
        self.attentions = [VAEAttentionBlock(channels, num_groups=groups, dtype=self.dtype)]

    def __call__(self, hidden_states):
        hidden_states = self.resnets[0](hidden_states)
        return self.resnets[1](self.attentions[0](hidden_states))
