"""DeepCache (branch 0, uniform) for SDXL's Flax UNet: a full UNet call that keeps one feature, a shallow one.

DeepCache (Ma et al., 2023; the `deepcache` package's `DeepCacheSDHelper`, DeepCache/extension/deepcache.py)
skips the deep part of the UNet on most steps: on steps where (i - first) % N == 0 the whole UNet runs and every
wrapped module's output is kept; on the others each wrapped module returns what it kept. `set_params` (l. 14-22):
`cache_layer_id = branch % 3`, `cache_block_id = branch // 3`, so branch 0 is block 0, layer 0. `wrap_modules`
(l. 57-81) wraps every down block and its resnets/attentions/downsampler, the mid block, and every up block and its
layers, numbering up blocks and their layers in reverse (the last up block is block 0, its last layer layer 0).
`is_skip_step` (l. 24-33) then skips, on a cached step, every block > 0, the mid block, every layer of down block 0
(`layer_i >= 0`), and the layers of the last up block with reversed index > 0. What still runs is the LAST layer
of the LAST up block (its resnet, and its attention where the block has one), plus what the UNet does outside its
blocks: the time and added embeddings, `conv_in`, and the output head. That last layer's inputs are the kept
output of the layer before it (the cached feature) and the skip connection from `conv_in` (fresh: `conv_in` is not
a wrapped block). For SDXL (last up block `UpBlock2D`, 3 resnets) the feature is
`up_blocks[2].resnets[1]`'s output: [cB, 128, 128, 320] at 1024x1024 (NHWC, as the Flax UNet holds it), and
[cB, 8, 8, 32] for the tiny checkpoint at 64x64 (c = 2 with classifier-free guidance, 1 without).

Here both modes run the UNet's own `__call__` (`nets/unet.UNet2DConditionModel`) with the same parameters tree,
steered by flax method interceptors (no second copy of the UNet, and the engine's attention hook, also an
interceptor, still applies):

    noise, feature = unet_full(unet, params, sample, t, hidden, added)            # = unet.apply(...), + feature
    noise = unet_shallow(unet, params, sample, t, hidden, added, feature)         # the cached step

`unet_full` only records the feature layer's output (the computation is the plain `apply`'s). `unet_shallow`
answers the down, mid and all but the last up block without running them (each returns its input, which nothing
reads: no operation is traced for them), and runs the last up block's last layer on (feature ++ the conv_in skip).
Fed with the feature of the same step, it computes exactly what `unet_full` computes. XLA's estimate for SDXL at
1024x1024 with CFG (bf16, cost analysis of the lowered HLO): 0.195 TFLOP for a shallow call against 13.51
for a full one.

The served step bodies (`step_full_local`, `step_shallow_local`) are `denoise.step_local` with these calls; the
feature is one more batch-split argument/result. `conditional_half_local` keeps the conditional half of what a
CFG step made ([2b] -> [b]) for the steps after `cfg_end` switches guidance off (see `host/planning/speed_plan.py`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import flax.linen as nn
import jax.numpy as jnp

from .denoise import unet_step
from .image_prompt import unet_layers


@dataclass(frozen=True)
class Cut:
    """Where branch 0 cuts a UNet: module names as in its parameters tree (diffusers' Flax names, kept by nets/)."""

    down_blocks: tuple[str, ...]  # every down block: skipped on a shallow step
    skipped_up_blocks: tuple[str, ...]  # every up block but the last: skipped
    last_up_block: str  # runs, but only its last layer (e.g. "up_blocks_2")
    feature_layer: str  # the last up block's layer whose output is the cached feature ("resnets_1" for SDXL)
    feature_channels: int  # channels of the feature (the last up block's output channels: block_out_channels[0])
    has_attention: bool  # the last up block is a CrossAttnUpBlock2D (its last attention runs too; not in SDXL)


def cut(unet) -> Cut:
    """Branch 0's cut of a Flax UNet from its config (no parameters needed)."""
    config = unet.config if hasattr(unet, "config") else unet
    blocks = len(config.down_block_types)
    layers = config.layers_per_block + 1  # every up block has one layer more than a down block
    if layers < 2:
        raise ValueError("DeepCache needs an up block with at least two layers (layers_per_block >= 1)")
    has_attention = config.up_block_types[-1] == "CrossAttnUpBlock2D"
    kind = "attentions" if has_attention else "resnets"
    return Cut(
        down_blocks=tuple(f"down_blocks_{i}" for i in range(blocks)),
        skipped_up_blocks=tuple(f"up_blocks_{i}" for i in range(len(config.up_block_types) - 1)),
        last_up_block=f"up_blocks_{len(config.up_block_types) - 1}",
        feature_layer=f"{kind}_{layers - 2}",
        feature_channels=int(config.block_out_channels[0]),
        has_attention=has_attention,
    )


def _unet_child(module, unet_type) -> str | None:
    """The name of `module` if it is a direct child of the UNet (a block), else None."""
    parent = getattr(module, "parent", None)
    return module.name if isinstance(parent, unet_type) else None


def _arguments(context, args, kwargs) -> dict:
    """A block's `__call__` arguments by name (the UNet passes some positionally, some by keyword)."""
    bound = inspect.signature(type(context.module).__call__).bind(context.module, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def unet_full(unet, params, sample, timesteps, encoder_hidden_states, added_cond_kwargs):
    """The plain UNet call, also returning branch 0's feature: (noise [B, 4, h, w], feature [B, h, w, C]).

    The same operations as `unet.apply({"params": params}, ...)`: the feature layer's output is only recorded.
    """
    where = cut(unet)
    kept = []
    unet_type = type(unet)

    def keep_feature(next_fun, args, kwargs, context):
        result = next_fun(*args, **kwargs)
        module = context.module
        if (
            context.method_name == "__call__"
            and module.name == where.feature_layer
            and _unet_child(module.parent, unet_type) == where.last_up_block
        ):
            kept.append(result)
        return result

    with nn.intercept_methods(keep_feature):
        noise = unet.apply(
            {"params": params},
            sample,
            timesteps,
            encoder_hidden_states=encoder_hidden_states,
            added_cond_kwargs=added_cond_kwargs,
        ).sample
    if len(kept) != 1:
        raise RuntimeError(f"DeepCache's feature layer {where.last_up_block}.{where.feature_layer} ran {len(kept)}x")
    return noise, kept[0]


def unet_shallow(unet, params, sample, timesteps, encoder_hidden_states, added_cond_kwargs, feature):
    """The UNet on a cached step: noise [B, 4, h, w] from the last up block's last layer on (feature ++ conv_in).

    `feature` [B, h, w, C] is what `unet_full` returned at the last full step (for the same rows). The down, mid
    and other up blocks are answered with placeholders (their input, never read), so none of them is computed.
    """
    where = cut(unet)
    unet_type = type(unet)
    skip = {"conv_in": None}  # conv_in's output, to check it is the skip the last layer takes

    def shallow(next_fun, args, kwargs, context):
        name = _unet_child(context.module, unet_type)
        if context.method_name != "__call__" or name is None:
            return next_fun(*args, **kwargs)
        if name == "conv_in":
            skip["conv_in"] = next_fun(*args, **kwargs)
            return skip["conv_in"]
        if name in where.down_blocks:
            block = context.module
            placeholder = args[0]  # its input: nothing on this path reads a down block's outputs but conv_in's
            outputs = block.num_layers + int(block.add_downsample)  # the UNet slices skips by count
            return placeholder, (placeholder,) * outputs
        if name == "mid_block" or name in where.skipped_up_blocks:
            return args[0]
        if name == where.last_up_block:
            return _last_layer(where, context, _arguments(context, args, kwargs), feature, skip["conv_in"])
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(shallow):
        return unet.apply(
            {"params": params},
            sample,
            timesteps,
            encoder_hidden_states=encoder_hidden_states,
            added_cond_kwargs=added_cond_kwargs,
        ).sample


def _last_layer(where: Cut, context, arguments: dict, feature, conv_in):
    """The last up block's last iteration (its own modules, as its `__call__` runs them) on the cached feature."""
    block = context.module
    skip = arguments["res_hidden_states_tuple"][0]  # the last one its loop pops
    if skip is not conv_in:
        raise RuntimeError("DeepCache branch 0 expects conv_in's output as the last up block's last skip")
    hidden = jnp.concatenate((feature.astype(skip.dtype), skip), axis=-1)
    hidden = block.resnets[-1](hidden, arguments["temb"])
    if where.has_attention:
        hidden = block.attentions[-1](hidden, arguments["encoder_hidden_states"])
    if block.add_upsample:  # never in SDXL's UNets (the final block does not upsample); kept for the loop's shape
        hidden = block.upsamplers_0(hidden)
    return hidden


# ---- the served step bodies (denoise.unet_step with a whole or a shallow UNet call) -------------------------------


def step_full_local(
    modules,
    params,
    latents,
    previous,
    hidden,
    pooled,
    key_lengths,
    guidance,
    seeds,
    coefficients,
    index,
    image,
    blend_sigma,
    *,
    cfg: bool,
    prediction_type: str,
):
    """`denoise.step_local` that also keeps DeepCache's feature: (latents', history', feature [cb, h, w, C])."""

    def call(sample, timesteps, added):
        with unet_layers(params, index, cfg):
            return unet_full(modules.unet, params["unet"], sample, timesteps, hidden, added)

    return unet_step(
        call,
        modules,
        latents,
        previous,
        hidden,
        pooled,
        key_lengths,
        guidance,
        seeds,
        coefficients,
        index,
        image,
        blend_sigma,
        cfg=cfg,
        prediction_type=prediction_type,
    )


def step_shallow_local(
    modules,
    params,
    latents,
    previous,
    hidden,
    pooled,
    key_lengths,
    guidance,
    seeds,
    coefficients,
    index,
    image,
    blend_sigma,
    feature,
    *,
    cfg: bool,
    prediction_type: str,
):
    """`denoise.step_local` on a cached step: the last whole step's `feature` [cb, h, w, C] -> (latents', history')."""

    def call(sample, timesteps, added):
        with unet_layers(params, index, cfg):
            return (unet_shallow(modules.unet, params["unet"], sample, timesteps, hidden, added, feature),)

    return unet_step(
        call,
        modules,
        latents,
        previous,
        hidden,
        pooled,
        key_lengths,
        guidance,
        seeds,
        coefficients,
        index,
        image,
        blend_sigma,
        cfg=cfg,
        prediction_type=prediction_type,
    )


def conditional_half_local(*arrays):
    """Each [2b, ...] array of a CFG step (unconditional half first) -> its conditional half [b, ...].

    Per device: a device's rows are its own [uncond, cond] pair of halves, so this must run inside the
    per-device body (shard_map), not on the global array. Used when `cfg_end` turns guidance off: the text
    conditioning (hidden, pooled), and the cached feature when the next step is a shallow one.
    """
    halves = tuple(jnp.split(array, 2, axis=0)[1] for array in arrays)
    return halves if len(halves) != 1 else halves[0]
