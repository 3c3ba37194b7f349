"""The ControlNet's conditioning embedding: the control image (8x the latents' side) -> a map the size of conv_in's.

Four 3x3 convolutions with SiLU, three of them stride 2, then a zero-initialised one (a fresh ControlNet starts as
a no-op). Names follow diffusers' (`conv_in`, `blocks_0` .. `blocks_5`, `conv_out`).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from . import layers


class ControlNetConditioningEmbedding(nn.Module):
    """[B, 8h, 8w, 3] -> [B, h, w, conditioning_embedding_channels]."""

    conditioning_embedding_channels: int
    block_out_channels: tuple[int, ...] = (16, 32, 96, 256)
    dtype: Any = jnp.float32

    def setup(self) -> None:
        channels = self.block_out_channels
        self.conv_in = layers.Conv(channels[0], (3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype)
        blocks = []
        for channel_in, channel_out in zip(channels[:-1], channels[1:], strict=True):
            blocks.append(layers.Conv(channel_in, (3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype))
            blocks.append(layers.Conv(channel_out, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), dtype=self.dtype))
        self.blocks = blocks
        self.conv_out = layers.Conv(
            self.conditioning_embedding_channels,
            (3, 3),
            padding=((1, 1), (1, 1)),
            dtype=self.dtype,
            kernel_init=nn.initializers.zeros_init(),
            bias_init=nn.initializers.zeros_init(),
        )

    def __call__(self, conditioning):
        embedding = nn.silu(self.conv_in(conditioning))
        for block in self.blocks:
            embedding = nn.silu(block(embedding))
        return self.conv_out(embedding)
