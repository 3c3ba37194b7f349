"""SDXL ControlNet in Flax: the module diffusers' PyTorch `ControlNetModel` is for SDXL configs.

diffusers' own `FlaxControlNetModel` predated SDXL: no `text_time` add-embedding, one transformer layer per block,
so a real SDXL ControlNet (transformer depth up to 10) would not load. This module is built from the project's UNet
blocks (`device/nets/`) the way the UNet builds SDXL's encoder half (per-block `transformer_layers_per_block`,
the `text_time` add-embedding), plus the conditioning embedding and the zero convolutions. Parameter names follow
PyTorch's after diffusers' `rename_key` (`controlnet_down_blocks_3`, `controlnet_cond_embedding/blocks_0`, ...), so
`checkpoint/controlnet_loading.py` converts a diffusers-layout file tensor by tensor, every name accounted for.

It returns the residuals unscaled, in the UNet's NHWC layout: the caller multiplies them by a per-step coefficient
(weight x the request's window), a traced number, so no weight or window compiles anything.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers
from .controlnet_embedding import ControlNetConditioningEmbedding
from .embeddings import TimestepEmbedding, Timesteps, sdxl_conditioning
from .unet_blocks import CrossAttnDownBlock2D, DownBlock2D, UNetMidBlock2DCrossAttn, run_down_blocks

#: What SDXL's UNet reads as size conditioning: (original h, w, crop top, left, target h, w).
TIME_IDS = 6


class SDXLControlNet(nn.Module):
    """SDXL's ControlNet: (latents, t, text, pooled text, time ids, control image) -> per-residual outputs."""

    in_channels: int = 4
    conditioning_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    block_out_channels: tuple[int, ...] = (320, 640, 1280)
    layers_per_block: int = 2
    attention_head_dim: int | tuple[int, ...] = (5, 10, 20)
    cross_attention_dim: int = 2048
    transformer_layers_per_block: int | tuple[int, ...] = (1, 2, 10)
    use_linear_projection: bool = True
    addition_time_embed_dim: int = 256
    projection_class_embeddings_input_dim: int = 2816
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    conditioning_embedding_out_channels: tuple[int, ...] = (16, 32, 96, 256)
    bgr: bool = False  # controlnet_conditioning_channel_order == "bgr"
    dtype: Any = jnp.float32

    @property
    def residual_count(self) -> int:
        """Down residuals: conv_in's, one per resnet, one per downsampler (the UNet's skip connections)."""
        blocks = len(self.down_block_types)
        return 1 + blocks * self.layers_per_block + (blocks - 1)

    def _per_block(self, value) -> tuple:
        return tuple(value) if isinstance(value, (list, tuple)) else (value,) * len(self.down_block_types)

    def setup(self) -> None:
        channels = self.block_out_channels
        heads = self._per_block(self.attention_head_dim)  # diffusers' naming: attention_head_dim counts heads
        depths = self._per_block(self.transformer_layers_per_block)
        time_embed_dim = channels[0] * 4
        self.conv_in = layers.Conv(channels[0], kernel_size=(3, 3), padding=((1, 1), (1, 1)), dtype=self.dtype)
        self.time_proj = Timesteps(channels[0], flip_sin_to_cos=self.flip_sin_to_cos, freq_shift=self.freq_shift)
        self.time_embedding = TimestepEmbedding(time_embed_dim, dtype=self.dtype)
        self.add_time_proj = Timesteps(self.addition_time_embed_dim, self.flip_sin_to_cos, self.freq_shift)
        self.add_embedding = TimestepEmbedding(time_embed_dim, dtype=self.dtype)
        self.controlnet_cond_embedding = ControlNetConditioningEmbedding(
            conditioning_embedding_channels=channels[0],
            block_out_channels=tuple(self.conditioning_embedding_out_channels),
            dtype=self.dtype,
        )
        down_blocks, zero_convs = [], [self._zero_conv(channels[0])]
        output_channel = channels[0]
        for i, block_type in enumerate(self.down_block_types):
            input_channel, output_channel = output_channel, channels[i]
            last = i == len(channels) - 1
            if block_type == "CrossAttnDownBlock2D":
                block = CrossAttnDownBlock2D(
                    in_channels=input_channel,
                    out_channels=output_channel,
                    num_layers=self.layers_per_block,
                    transformer_layers_per_block=depths[i],
                    num_attention_heads=heads[i],
                    add_downsample=not last,
                    use_linear_projection=self.use_linear_projection,
                    dtype=self.dtype,
                )
            else:
                block = DownBlock2D(
                    in_channels=input_channel,
                    out_channels=output_channel,
                    num_layers=self.layers_per_block,
                    add_downsample=not last,
                    dtype=self.dtype,
                )
            down_blocks.append(block)
            zero_convs += [self._zero_conv(output_channel) for _ in range(self.layers_per_block + (not last))]
        self.down_blocks = down_blocks
        self.controlnet_down_blocks = zero_convs
        self.mid_block = UNetMidBlock2DCrossAttn(
            in_channels=channels[-1],
            num_attention_heads=heads[-1],
            transformer_layers_per_block=depths[-1],
            use_linear_projection=self.use_linear_projection,
            dtype=self.dtype,
        )
        self.controlnet_mid_block = self._zero_conv(channels[-1])

    def _zero_conv(self, channels: int) -> layers.Conv:
        return layers.Conv(
            channels,
            kernel_size=(1, 1),
            padding="VALID",
            kernel_init=nn.initializers.zeros_init(),
            bias_init=nn.initializers.zeros_init(),
            dtype=self.dtype,
        )

    def __call__(self, sample, timesteps, encoder_hidden_states, text_embeds, time_ids, control):
        """sample [b, 4, h, w], timesteps [b], encoder_hidden_states [b, L, D], text_embeds [b, P], time_ids [b, 6],
        control [b, 3, 8h, 8w] in [0, 1] (RGB) -> (down residuals, each [b, h_i, w_i, C_i] NHWC; mid residual)."""
        emb = sdxl_conditioning(self, timesteps, text_embeds, time_ids)  # [b, 4 x C0]
        if self.bgr:
            control = jnp.flip(control, axis=1)
        sample = self.conv_in(jnp.transpose(sample, (0, 2, 3, 1)))  # [b, h, w, C0]
        sample = sample + self.controlnet_cond_embedding(jnp.transpose(control, (0, 2, 3, 1)))
        sample, residuals = run_down_blocks(self.down_blocks, sample, emb, encoder_hidden_states)
        sample = self.mid_block(sample, emb, encoder_hidden_states)
        down = tuple(conv(residual) for conv, residual in zip(self.controlnet_down_blocks, residuals, strict=True))
        return down, self.controlnet_mid_block(sample)

    def init_weights(self, rng, latent_size: int = 8):
        """Parameters for the shapes only (the loader traces this with `jax.eval_shape`)."""
        text_dim = self.projection_class_embeddings_input_dim - TIME_IDS * self.addition_time_embed_dim
        return self.init(
            rng,
            jnp.zeros((1, self.in_channels, latent_size, latent_size), jnp.float32),
            jnp.ones((1,), jnp.float32),
            jnp.zeros((1, 1, self.cross_attention_dim), jnp.float32),
            jnp.zeros((1, text_dim), jnp.float32),
            jnp.zeros((1, TIME_IDS), jnp.float32),
            jnp.zeros((1, self.conditioning_channels, latent_size * 8, latent_size * 8), jnp.float32),
        )["params"]


def shape_params(module: SDXLControlNet):
    """The parameter tree's shapes, traced: nothing allocated."""
    return jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
