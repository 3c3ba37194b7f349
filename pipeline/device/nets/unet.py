"""SDXL's UNet: noisy latents, timestep, text and size conditioning -> the predicted noise (or v).

One module for SDXL base (6 time ids), the refiner (5: no target size, an aesthetic score instead; found from
`projection_class_embeddings_input_dim` as diffusers does) and the 9-channel inpainting UNet (`in_channels`).
The configuration is the checkpoint's own `unet/config.json` (`UNetConfig.from_dict`), keeping diffusers' names,
including its misnomer: `attention_head_dim` is the number of heads per block.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers
from .embeddings import TimestepEmbedding, Timesteps, sdxl_conditioning
from .unet_blocks import (
    CrossAttnDownBlock2D,
    CrossAttnUpBlock2D,
    DownBlock2D,
    UNetMidBlock2DCrossAttn,
    UpBlock2D,
    run_down_blocks,
)


def _per_block(value, blocks: int) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * blocks


#: Config entries whose other values diffusers' Flax UNet honoured but SDXL never uses (refused, not ignored).
_SDXL_ONLY = {"mid_block_type": "UNetMidBlock2DCrossAttn", "only_cross_attention": False, "num_attention_heads": None}


@dataclasses.dataclass(frozen=True)
class UNetConfig:
    """The fields of a diffusers `unet/config.json` that shape SDXL's UNet (defaults: SDXL base 1.0's)."""

    sample_size: int = 128
    in_channels: int = 4
    out_channels: int = 4
    down_block_types: tuple[str, ...] = ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    up_block_types: tuple[str, ...] = ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    block_out_channels: tuple[int, ...] = (320, 640, 1280)
    layers_per_block: int = 2
    attention_head_dim: tuple[int, ...] = (5, 10, 20)  # heads per block (diffusers' name)
    transformer_layers_per_block: tuple[int, ...] = (1, 2, 10)
    cross_attention_dim: int = 2048
    use_linear_projection: bool = True
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    addition_embed_type: str = "text_time"
    addition_time_embed_dim: int = 256
    projection_class_embeddings_input_dim: int = 2816

    @classmethod
    def from_dict(cls, config: dict) -> UNetConfig:
        """From a config.json's fields (others, such as `_class_name` or `act_fn`, are not read); lists -> tuples."""
        names = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in config.items() if key in names}
        blocks = len(values.get("down_block_types", cls.down_block_types))
        for key in ("attention_head_dim", "transformer_layers_per_block"):
            if key in values:
                values[key] = _per_block(values[key], blocks)
        for key in ("down_block_types", "up_block_types", "block_out_channels"):
            if key in values:
                values[key] = tuple(values[key])
        made = cls(**values)
        if made.addition_embed_type != "text_time":
            raise ValueError(f"addition_embed_type {made.addition_embed_type!r}: SDXL's UNet has 'text_time'")
        for key, sdxl in _SDXL_ONLY.items():  # options diffusers' Flax UNet had and SDXL never sets
            if config.get(key, sdxl) != sdxl:
                raise ValueError(f"{key} {config[key]!r}: SDXL's UNet has {sdxl!r}")
        return made

    @property
    def time_ids(self) -> int:
        """Size conditioning numbers: 6 for base (original size, crop, target size), 5 for the refiner."""
        refiner = 5 * self.addition_time_embed_dim + self.cross_attention_dim
        return 5 if refiner == self.projection_class_embeddings_input_dim else 6

    @property
    def text_embeds_dim(self) -> int:
        """Width of the pooled text embedding the add-embedding reads (SDXL: 1280)."""
        return self.projection_class_embeddings_input_dim - self.time_ids * self.addition_time_embed_dim


@flax.struct.dataclass
class UNetOutput:
    """What `UNet2DConditionModel` returns with `return_dict=True` (diffusers' `.sample`)."""

    sample: jax.Array  # [B, out_channels, h, w]


class UNet2DConditionModel(nn.Module):
    """SDXL's UNet; its parameter tree is diffusers' Flax UNet's for the same config."""

    config: UNetConfig = UNetConfig()
    dtype: Any = jnp.float32

    @property
    def in_channels(self) -> int:
        return self.config.in_channels

    def setup(self) -> None:
        config = self.config
        channels = config.block_out_channels
        blocks = len(config.down_block_types)
        heads = _per_block(config.attention_head_dim, blocks)
        depths = _per_block(config.transformer_layers_per_block, blocks)
        time_embed_dim = channels[0] * 4
        self.conv_in = layers.Conv(channels[0], (3, 3), strides=(1, 1), padding=((1, 1), (1, 1)), dtype=self.dtype)
        self.time_proj = Timesteps(channels[0], config.flip_sin_to_cos, config.freq_shift)
        self.time_embedding = TimestepEmbedding(time_embed_dim, dtype=self.dtype)
        self.add_time_proj = Timesteps(config.addition_time_embed_dim, config.flip_sin_to_cos, config.freq_shift)
        self.add_embedding = TimestepEmbedding(time_embed_dim, dtype=self.dtype)

        self.down_blocks = _down_blocks(config, heads, depths, self.dtype)
        self.mid_block = UNetMidBlock2DCrossAttn(
            in_channels=channels[-1],
            num_attention_heads=heads[-1],
            transformer_layers_per_block=depths[-1],
            use_linear_projection=config.use_linear_projection,
            dtype=self.dtype,
        )
        self.up_blocks = _up_blocks(config, heads, depths, self.dtype)
        self.conv_norm_out = layers.GroupNorm(num_groups=32, epsilon=1e-5)
        self.conv_out = layers.Conv(
            config.out_channels, (3, 3), strides=(1, 1), padding=((1, 1), (1, 1)), dtype=self.dtype
        )

    def __call__(
        self,
        sample,
        timesteps,
        encoder_hidden_states,
        added_cond_kwargs=None,
        down_block_additional_residuals=None,
        mid_block_additional_residual=None,
        return_dict: bool = True,
    ):
        """sample [B, C, h, w] (NCHW, as diffusers), timesteps [B] (or a number), encoder_hidden_states [B, L, D],
        added_cond_kwargs {"text_embeds": [B, P], "time_ids": [B, 6 or 5]}; a ControlNet's residuals (NHWC) are
        added to the skips and to the middle block's output. -> `UNetOutput` (or a 1-tuple) with [B, C', h, w]."""
        if not isinstance(timesteps, jnp.ndarray):
            timesteps = jnp.array([timesteps], dtype=jnp.int32)
        elif timesteps.ndim == 0:
            timesteps = jnp.expand_dims(timesteps.astype(dtype=jnp.float32), 0)
        if added_cond_kwargs is None:
            raise ValueError("SDXL's UNet needs added_cond_kwargs with text_embeds and time_ids")
        text_embeds, time_ids = added_cond_kwargs["text_embeds"], added_cond_kwargs["time_ids"]
        emb = sdxl_conditioning(self, timesteps, text_embeds, time_ids)  # [B, 4 x C0]

        sample = self.conv_in(jnp.transpose(sample, (0, 2, 3, 1)))  # [B, h, w, C0]
        sample, skips = run_down_blocks(self.down_blocks, sample, emb, encoder_hidden_states)
        if down_block_additional_residuals is not None:
            skips = tuple(skip + extra for skip, extra in zip(skips, down_block_additional_residuals, strict=True))
        sample = self.mid_block(sample, emb, encoder_hidden_states)
        if mid_block_additional_residual is not None:
            sample = sample + mid_block_additional_residual

        per_block = self.config.layers_per_block + 1
        for block in self.up_blocks:
            taken, skips = skips[-per_block:], skips[:-per_block]
            if isinstance(block, CrossAttnUpBlock2D):
                sample = block(
                    sample, res_hidden_states_tuple=taken, temb=emb, encoder_hidden_states=encoder_hidden_states
                )
            else:
                sample = block(sample, res_hidden_states_tuple=taken, temb=emb)
        sample = self.conv_out(nn.silu(self.conv_norm_out(sample)))
        sample = jnp.transpose(sample, (0, 3, 1, 2))  # [B, C', h, w]
        return UNetOutput(sample=sample) if return_dict else (sample,)

    def text_keys_values(self, encoder_hidden_states) -> dict:
        """Every cross-attention layer's keys and values of the text, by layer path: {"up_blocks_0/.../attn2":
        (k, v) [B, L, N*H]}, made by the layers' own `to_k` and `to_v` (apply with `method=`; device/cross_kv.py)."""
        table = {}
        for block in (*self.down_blocks, self.mid_block, *self.up_blocks):
            for transformer in getattr(block, "attentions", ()):
                for layer in transformer.transformer_blocks:
                    attention = layer.attn2
                    table["/".join(attention.path)] = (
                        attention.key(encoder_hidden_states),
                        attention.value(encoder_hidden_states),
                    )
        return table

    def init_weights(self, rng) -> dict:
        """Parameters for the config's shapes (the loaders trace this with `jax.eval_shape`)."""
        config = self.config
        sample = jnp.zeros((1, config.in_channels, config.sample_size, config.sample_size), jnp.float32)
        added = {
            "text_embeds": jnp.zeros((1, config.text_embeds_dim), jnp.float32),
            "time_ids": jnp.zeros((1, config.time_ids), jnp.float32),
        }
        text = jnp.zeros((1, 1, config.cross_attention_dim), jnp.float32)
        return self.init(rng, sample, jnp.ones((1,), jnp.int32), text, added)["params"]


def _down_blocks(config: UNetConfig, heads: tuple, depths: tuple, dtype) -> list:
    """The UNet's down blocks: each halves the latents but the last; the cross-attention ones with their heads and
    transformer depth (`heads`, `depths`: per block)."""
    channels = config.block_out_channels
    down_blocks, output_channel = [], channels[0]
    for i, block_type in enumerate(config.down_block_types):
        input_channel, output_channel = output_channel, channels[i]
        common = dict(
            in_channels=input_channel,
            out_channels=output_channel,
            num_layers=config.layers_per_block,
            add_downsample=i < len(channels) - 1,
            dtype=dtype,
        )
        if block_type == "CrossAttnDownBlock2D":
            down_blocks.append(
                CrossAttnDownBlock2D(
                    **common,
                    num_attention_heads=heads[i],
                    transformer_layers_per_block=depths[i],
                    use_linear_projection=config.use_linear_projection,
                )
            )
        else:
            down_blocks.append(DownBlock2D(**common))
    return down_blocks


def _up_blocks(config: UNetConfig, heads: tuple, depths: tuple, dtype) -> list:
    """The UNet's up blocks, the down blocks mirrored: each takes its skips (one more layer than a down block) and
    doubles the latents but the last."""
    channels = config.block_out_channels
    up_blocks, reversed_channels = [], list(reversed(channels))
    output_channel = reversed_channels[0]
    for i, block_type in enumerate(config.up_block_types):
        previous, output_channel = output_channel, reversed_channels[i]
        common = dict(
            in_channels=reversed_channels[min(i + 1, len(channels) - 1)],
            out_channels=output_channel,
            prev_output_channel=previous,
            num_layers=config.layers_per_block + 1,
            add_upsample=i < len(channels) - 1,
            dtype=dtype,
        )
        if block_type == "CrossAttnUpBlock2D":
            up_blocks.append(
                CrossAttnUpBlock2D(
                    **common,
                    num_attention_heads=heads[::-1][i],
                    transformer_layers_per_block=depths[::-1][i],
                    use_linear_projection=config.use_linear_projection,
                )
            )
        else:
            up_blocks.append(UpBlock2D(**common))
    return up_blocks
