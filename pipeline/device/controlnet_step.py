"""One denoising step with ControlNets: their residuals, each scaled by a per-step number, fed to the UNet.

The same step as `denoise.step_local` (guidance, sampler update, the picture's blend), with the UNet call preceded by
the request's ControlNets (`device/nets/controlnet.py`) on the same input, text and time embedding, as diffusers'
`StableDiffusionXLControlNetPipeline` calls them (no guess mode: both CFG halves see the control map). The scales
(weight x window) are traced numbers, so one program serves every weight and window; a ControlNet whose scale is 0
on a step is skipped there (`lax.cond`), which is exact: its residuals would be multiplied by 0. The units of one
union ControlNet (`nets/controlnet_union.py`) are one call with their maps as its conditions, their control types
traced, as diffusers' `StableDiffusionXLControlNetUnionPipeline` runs them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .denoise import unet_step
from .image_prompt import unet_layers
from .modules import Modules
from .nets.controlnet_union import SDXLControlNetUnion


def is_union(module) -> bool:
    """A ControlNet Union (`nets/controlnet_union.py`): its units are one forward with several conditions."""
    return isinstance(module, SDXLControlNetUnion)


def call_groups(controlnets) -> list[tuple[int, ...]]:
    """The units' indices per ControlNet call: each plain unit alone; a union's units (adjacent: sorted by
    architecture, one per union model) together."""
    groups: list[tuple[int, ...]] = []
    for i, module in enumerate(controlnets):
        if groups and is_union(module) and controlnets[groups[-1][0]] is module:
            groups[-1] += (i,)
        else:
            groups.append((i,))
    return groups


def control_residuals(controlnets, trees, scales, sample, timesteps, hidden, added, controls, types=None):
    """Sum of each ControlNet's residuals x its scale (diffusers' MultiControlNetModel adds them in order).

    controlnets: static modules; trees: their weights; scales float32 [n]; controls: [cb, 3, H, W] in [0, 1] each;
    types int32 [n] (a union unit's control type). A union's units are one call (`union_residuals`).
    Returns (down residuals, each [cb, h_i, w_i, C_i]; mid residual [cb, h', w', C']) in the UNet's NHWC layout.
    """
    total = None
    for group in call_groups(controlnets):
        i, module, tree = group[0], controlnets[group[0]], trees[group[0]]
        if is_union(module):
            call = union_call(module, tree, group, scales, types, sample, timesteps, hidden, added, controls)
            acts = jnp.any(scales[jnp.asarray(group)] != 0)
        else:
            scale = scales[i]
            call = plain_call(module, tree, scale, sample, timesteps, hidden, added, controls[i])
            acts = scale != 0
        shapes = jax.eval_shape(call)
        zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        residuals = jax.lax.cond(acts, call, lambda zeros=zeros: zeros)
        total = residuals if total is None else jax.tree_util.tree_map(jnp.add, total, residuals)
    return total


def plain_call(module, tree, scale, sample, timesteps, hidden, added, control):
    """One plain ControlNet's residuals x its scale, as a function of nothing (for `lax.cond`)."""

    def scaled():
        latents = sample[:, : module.in_channels]  # an inpainting UNet's input begins with the latents
        down, mid = module.apply(
            {"params": tree},
            latents,
            timesteps,
            hidden,
            added["text_embeds"],
            added["time_ids"],
            control.astype(sample.dtype),
        )
        return tuple(r * scale.astype(r.dtype) for r in down), mid * scale.astype(mid.dtype)

    return scaled


def union_call(module, tree, group, scales, types, sample, timesteps, hidden, added, controls):
    """A union ControlNet's residuals with the `group` units' maps as its conditions (the module scales them)."""

    def scaled():
        index = jnp.asarray(group)
        return module.apply(
            {"params": tree},
            sample[:, : module.in_channels],
            timesteps,
            hidden,
            added["text_embeds"],
            added["time_ids"],
            jnp.stack([controls[i] for i in group]).astype(sample.dtype),  # [k, cb, 3, H, W]
            types[index],
            scales[index],
        )

    return scaled


def step_control_local(
    modules: Modules,
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
    controls,
    scales,
    types=None,
    *,
    cfg: bool,
    prediction_type: str,
    nets: tuple[int, ...],
):
    """`denoise.step_local` with ControlNets: params {"unet", "controlnets": one tree per unit}, controls one
    float32 [b, 3, H, W] map per unit (the images on this device), scales float32 [n] (this step's weight x window
    per unit), types int32 [n] (the union units' control types; only where a union is among them), `nets` (static)
    the architecture (`modules.controlnets` index) of each unit."""
    controlnets = tuple(modules.controlnets[i] for i in nets)
    maps = tuple(jnp.concatenate([c, c]) if cfg else c for c in controls)  # [cb, 3, H, W]: both halves see it
    return unet_step(
        controlled_unet(modules, params, controlnets, scales, hidden, maps, types, index=index, cfg=cfg),
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


def controlled_unet(modules: Modules, params, controlnets, scales, hidden, maps, types=None, *, index, cfg: bool):
    """The UNet call of a step with ControlNets (`unet_step`'s `call`): the units' scaled residuals
    (`control_residuals`), made from the same input, text and time embedding, added to the UNet's skips and middle
    block. `maps`: each unit's [cb, 3, H, W], both guidance halves'."""

    def call(sample, timesteps, added):
        down, mid = control_residuals(
            controlnets, params["controlnets"], scales, sample, timesteps, hidden, added, maps, types
        )
        with unet_layers(params, index, cfg):  # the UNet's layers only: the ControlNets project their own
            return (
                modules.unet.apply(
                    {"params": params["unet"]},
                    sample,
                    timesteps,
                    encoder_hidden_states=hidden,
                    added_cond_kwargs=added,
                    down_block_additional_residuals=down,
                    mid_block_additional_residual=mid,
                ).sample,
            )

    return call
