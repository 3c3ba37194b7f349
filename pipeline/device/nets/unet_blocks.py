"""The UNet's blocks: down (with or without transformers), the middle, up (taking the skips back), in SDXL's form.

A down block returns its output and every intermediate map (the skips); an up block takes its share of the skips,
last first, concatenating each to its input along channels. Names (`resnets_0`, `attentions_1`, `downsamplers_0`)
are diffusers': DeepCache (`device/deepcache.py`) cuts the UNet by them and LoRA maps onto them.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from .resnet import Downsample2D, ResnetBlock2D, Upsample2D
from .transformer import Transformer2DModel


def _transformer(block, channels: int) -> Transformer2DModel:
    """The spatial transformer a block puts after each resnet: `num_attention_heads` heads over `channels`."""
    return Transformer2DModel(
        in_channels=channels,
        n_heads=block.num_attention_heads,
        d_head=channels // block.num_attention_heads,
        depth=block.transformer_layers_per_block,
        use_linear_projection=block.use_linear_projection,
        dtype=block.dtype,
    )


class DownBlock2D(nn.Module):
    """`num_layers` resnets, then a stride-2 downsampler unless it is the last block."""

    in_channels: int
    out_channels: int
    num_layers: int = 2
    add_downsample: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = [
            ResnetBlock2D(self.in_channels if i == 0 else self.out_channels, self.out_channels, dtype=self.dtype)
            for i in range(self.num_layers)
        ]
        if self.add_downsample:
            self.downsamplers_0 = Downsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states, temb):
        """[B, H, W, Cin] -> ([B, H', W', Cout], the skips: one per resnet and the downsampler's)."""
        output_states = ()
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states, temb)
            output_states += (hidden_states,)
        if self.add_downsample:
            hidden_states = self.downsamplers_0(hidden_states)
            output_states += (hidden_states,)
        return hidden_states, output_states


class CrossAttnDownBlock2D(nn.Module):
    """`DownBlock2D` with a spatial transformer (attending to the text) after each resnet."""

    in_channels: int
    out_channels: int
    num_layers: int = 2
    num_attention_heads: int = 1
    transformer_layers_per_block: int = 1
    add_downsample: bool = True
    use_linear_projection: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = [
            ResnetBlock2D(self.in_channels if i == 0 else self.out_channels, self.out_channels, dtype=self.dtype)
            for i in range(self.num_layers)
        ]
        self.attentions = [_transformer(self, self.out_channels) for _ in range(self.num_layers)]
        if self.add_downsample:
            self.downsamplers_0 = Downsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states, temb, encoder_hidden_states):
        """[B, H, W, Cin], temb [B, T], text [B, L, D] -> ([B, H', W', Cout], the skips)."""
        output_states = ()
        for resnet, attention in zip(self.resnets, self.attentions, strict=True):
            hidden_states = attention(resnet(hidden_states, temb), encoder_hidden_states)
            output_states += (hidden_states,)
        if self.add_downsample:
            hidden_states = self.downsamplers_0(hidden_states)
            output_states += (hidden_states,)
        return hidden_states, output_states


def _up_resnets(block) -> list[ResnetBlock2D]:
    """An up block's resnets: each takes its input ++ one skip (the last skip is the previous block's width)."""
    resnets = []
    for i in range(block.num_layers):
        skip_channels = block.in_channels if i == block.num_layers - 1 else block.out_channels
        input_channels = block.prev_output_channel if i == 0 else block.out_channels
        resnets.append(ResnetBlock2D(input_channels + skip_channels, block.out_channels, dtype=block.dtype))
    return resnets


class UpBlock2D(nn.Module):
    """`num_layers` resnets, each on (input ++ a skip), then a 2x upsampler unless it is the last block."""

    in_channels: int
    out_channels: int
    prev_output_channel: int
    num_layers: int = 3
    add_upsample: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = _up_resnets(self)
        if self.add_upsample:
            self.upsamplers_0 = Upsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states, res_hidden_states_tuple, temb):
        """[B, H, W, Cprev], skips (last used first), temb [B, T] -> [B, H', W', Cout]."""
        for resnet in self.resnets:
            skip, res_hidden_states_tuple = res_hidden_states_tuple[-1], res_hidden_states_tuple[:-1]
            hidden_states = resnet(jnp.concatenate((hidden_states, skip), axis=-1), temb)
        if self.add_upsample:
            hidden_states = self.upsamplers_0(hidden_states)
        return hidden_states


class CrossAttnUpBlock2D(nn.Module):
    """`UpBlock2D` with a spatial transformer (attending to the text) after each resnet."""

    in_channels: int
    out_channels: int
    prev_output_channel: int
    num_layers: int = 3
    num_attention_heads: int = 1
    transformer_layers_per_block: int = 1
    add_upsample: bool = True
    use_linear_projection: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = _up_resnets(self)
        self.attentions = [_transformer(self, self.out_channels) for _ in range(self.num_layers)]
        if self.add_upsample:
            self.upsamplers_0 = Upsample2D(self.out_channels, dtype=self.dtype)

    def __call__(self, hidden_states, res_hidden_states_tuple, temb, encoder_hidden_states):
        """[B, H, W, Cprev], skips (last used first), temb [B, T], text [B, L, D] -> [B, H', W', Cout]."""
        for resnet, attention in zip(self.resnets, self.attentions, strict=True):
            skip, res_hidden_states_tuple = res_hidden_states_tuple[-1], res_hidden_states_tuple[:-1]
            hidden_states = resnet(jnp.concatenate((hidden_states, skip), axis=-1), temb)
            hidden_states = attention(hidden_states, encoder_hidden_states)
        if self.add_upsample:
            hidden_states = self.upsamplers_0(hidden_states)
        return hidden_states


class UNetMidBlock2DCrossAttn(nn.Module):
    """resnet, then (transformer, resnet) at the bottom of the UNet, at its widest."""

    in_channels: int
    num_attention_heads: int = 1
    transformer_layers_per_block: int = 1
    use_linear_projection: bool = True
    dtype: Any = jnp.float32

    def setup(self) -> None:
        self.resnets = [ResnetBlock2D(self.in_channels, self.in_channels, dtype=self.dtype) for _ in range(2)]
        self.attentions = [_transformer(self, self.in_channels)]

    def __call__(self, hidden_states, temb, encoder_hidden_states):
        """[B, H, W, C], temb [B, T], text [B, L, D] -> [B, H, W, C]."""
        hidden_states = self.resnets[0](hidden_states, temb)
        hidden_states = self.attentions[0](hidden_states, encoder_hidden_states)
        return self.resnets[1](hidden_states, temb)


def run_down_blocks(blocks, sample, emb, encoder_hidden_states):
    """The encoder half, as the UNet and a ControlNet both run it: -> (the last block's output, every skip from
    `sample` on, in order)."""
    skips = (sample,)
    for block in blocks:
        if isinstance(block, CrossAttnDownBlock2D):
            sample, outputs = block(sample, emb, encoder_hidden_states)
        else:
            sample, outputs = block(sample, emb)
        skips += outputs
    return sample, skips
