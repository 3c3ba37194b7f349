"""ControlNet Union (xinsir's ProMax) in Flax: `SDXLControlNet` plus the parts diffusers' `ControlNetUnionModel` adds.

One SDXL ControlNet trained on a dozen control types, several at once. Against a plain ControlNet it adds:
- the task embedding: one learnt vector per control type, added to each condition's pooled feature;
- a small transformer (`transformer_layes`, diffusers' spelling) over those pooled features and the latents' own;
- the spatial channel projection (`spatial_ch_projs`): what the transformer made of each condition, added to that
  condition's embedding as a per-channel offset before the conditions are summed into the latents' features;
- the control-type add-embedding: the multi-hot of the types in use, sinusoid-embedded like the size ids, added to
  the time embedding.

The transformer is PyTorch's `nn.MultiheadAttention` with its default `batch_first=False` fed a [batch, token, C]
tensor, so it attends across the batch at each token position (xinsir's code and diffusers' alike): reproduced
exactly here, over the rows of the call (both guidance halves of this device's images). Tokens never attend to
each other, so a condition slot that is not in use (scale 0) changes nothing but its own token.

Conditions come in a fixed number of slots (a program shape); types and scales are traced values. diffusers scales a
lone condition on the residuals and several conditions inside (their embeddings and offsets, residuals unscaled):
both are one formula here, chosen by the traced count of slots in use, so no type or count compiles anything.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from . import layers
from .controlnet import TIME_IDS, SDXLControlNet
from .embeddings import TimestepEmbedding, Timesteps, sdxl_conditioning
from .unet_blocks import run_down_blocks


class BatchAttention(nn.Module):
    """PyTorch's `nn.MultiheadAttention` (packed `in_proj_weight`/`in_proj_bias`, `out_proj`) over axis 0."""

    channels: int
    heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):  # [b, T, C]: sequence b, batch T (batch_first=False)
        weight = self.param("in_proj_weight", nn.initializers.lecun_normal(), (3 * self.channels, self.channels))
        bias = self.param("in_proj_bias", nn.initializers.zeros_init(), (3 * self.channels,))
        packed = jnp.einsum("btc,dc->btd", x, weight.astype(x.dtype)) + bias.astype(x.dtype)
        head = self.channels // self.heads
        q, k, v = (part.reshape(*x.shape[:2], self.heads, head) for part in jnp.split(packed, 3, axis=-1))
        scores = jnp.einsum("bthd,sthd->thbs", q, k) / jnp.sqrt(jnp.asarray(head, x.dtype))
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
        out = jnp.einsum("thbs,sthd->bthd", probs, v).reshape(x.shape)
        return layers.Dense(self.channels, dtype=self.dtype, name="out_proj")(out)


class ResidualAttentionBlock(nn.Module):
    """diffusers' `ResidualAttentionBlock`: pre-norm attention and a QuickGELU MLP, each added back."""

    channels: int
    heads: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        norm = lambda name: layers.LayerNorm(epsilon=1e-5, dtype=self.dtype, name=name)  # noqa: E731 (PyTorch's eps)
        x = x + BatchAttention(self.channels, self.heads, dtype=self.dtype, name="attn")(norm("ln_1")(x))
        return x + QuickGeluMlp(self.channels, dtype=self.dtype, name="mlp")(norm("ln_2")(x))


class QuickGeluMlp(nn.Module):
    """diffusers' `ResidualAttentionMlp`: 4x wide, QuickGELU (x * sigmoid(1.702 x)) between."""

    channels: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        hidden = layers.Dense(self.channels * 4, dtype=self.dtype, name="c_fc")(x)
        hidden = hidden * jax.nn.sigmoid(1.702 * hidden)
        return layers.Dense(self.channels, dtype=self.dtype, name="c_proj")(hidden)


class SDXLControlNetUnion(SDXLControlNet):
    """ControlNet Union: (latents, t, text, pooled, time ids, controls [N slots], types [N], scales [N]) -> residuals
    already scaled (diffusers' union scaling), in the UNet's NHWC layout."""

    num_control_type: int = 8
    num_trans_channel: int = 320
    num_trans_head: int = 8
    num_trans_layer: int = 1
    num_proj_channel: int = 320

    def setup(self) -> None:
        super().setup()
        self.task_embedding = self.param(
            "task_embedding", nn.initializers.normal(1.0), (self.num_control_type, self.num_trans_channel)
        )
        self.transformer_layes = [
            ResidualAttentionBlock(self.num_trans_channel, self.num_trans_head, dtype=self.dtype)
            for _ in range(self.num_trans_layer)
        ]
        self.spatial_ch_projs = layers.Dense(self.num_proj_channel, dtype=self.dtype)
        self.control_type_proj = Timesteps(self.addition_time_embed_dim, self.flip_sin_to_cos, self.freq_shift)
        self.control_add_embedding = TimestepEmbedding(self.block_out_channels[0] * 4, dtype=self.dtype)

    def __call__(self, sample, timesteps, encoder_hidden_states, text_embeds, time_ids, controls, types, scales):
        """controls [N, b, 3, 8h, 8w] in [0, 1] (RGB), types int32 [N] (ProMax index; -1: slot not in use), scales
        float32 [N] (this step's weight x window; 0 where not in use) -> (down residuals [b, h_i, w_i, C_i]; mid)."""
        in_use = types >= 0
        single = jnp.sum(in_use) == 1  # diffusers: one condition is scaled on the residuals, several inside
        inner = jnp.where(single, in_use.astype(scales.dtype), scales).astype(self.dtype)
        outer = jnp.where(single, jnp.sum(jnp.where(in_use, scales, 0.0)), 1.0)
        batch = sample.shape[0]
        multi_hot = jnp.max(jax.nn.one_hot(types, self.num_control_type) * in_use[:, None], axis=0)
        control_embeds = self.control_type_proj(jnp.tile(multi_hot, batch)).reshape((batch, -1))
        emb = sdxl_conditioning(self, timesteps, text_embeds, time_ids) + self.control_add_embedding(control_embeds)
        sample = self.conv_in(jnp.transpose(sample, (0, 2, 3, 1)))  # [b, h, w, C0]
        slots = controls.shape[0]
        maps = jnp.transpose(controls, (0, 1, 3, 4, 2)).reshape((slots * batch, *controls.shape[3:], controls.shape[2]))
        conditions = self.controlnet_cond_embedding(maps.astype(sample.dtype))
        conditions = conditions.reshape((slots, batch, *conditions.shape[1:]))  # [N, b, h, w, C0]
        pooled = jnp.mean(conditions, axis=(2, 3)) + self.task_embedding[jnp.maximum(types, 0)][:, None]  # [N, b, C]
        tokens = jnp.concatenate(
            [jnp.moveaxis(pooled * inner[:, None, None], 0, 1), jnp.mean(sample, axis=(1, 2))[:, None]], axis=1
        )  # [b, N + 1, C]
        for layer in self.transformer_layes:
            tokens = layer(tokens)
        alpha = jnp.moveaxis(self.spatial_ch_projs(tokens[:, :-1]), 1, 0)  # [N, b, C]
        fused = (conditions + alpha[:, :, None, None]) * inner[:, None, None, None, None]
        sample = sample + jnp.sum(fused, axis=0)
        sample, residuals = run_down_blocks(self.down_blocks, sample, emb, encoder_hidden_states)
        sample = self.mid_block(sample, emb, encoder_hidden_states)
        outer = outer.astype(sample.dtype)
        down = tuple(conv(r) * outer for conv, r in zip(self.controlnet_down_blocks, residuals, strict=True))
        return down, self.controlnet_mid_block(sample) * outer

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
            jnp.zeros((1, 1, self.conditioning_channels, latent_size * 8, latent_size * 8), jnp.float32),
            jnp.zeros((1,), jnp.int32),
            jnp.ones((1,), jnp.float32),
        )["params"]
