"""The base's step with FreeU (`device/freeu.py`), perturbed-attention guidance (`device/pag.py`) or both: the
plain step's body (`denoise.unet_step`) around a UNet call steered by their hooks.

Its one more argument, `extras` float32 [b, 5] (`EXTRAS`), holds each image's FreeU factors and this step's PAG
scale: values, so one program serves every request that turns them on. Which of the two a program runs is static
(`ProgramKey.extras`); a request with neither runs today's step programs, unchanged.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp

from .cross_kv import CROSS_KV, table_of
from .denoise import unet_step
from .freeu import FACTORS, freeu
from .image_prompt import unet_layers
from .modules import Modules
from .pag import perturbed_attention, with_perturbed_rows

#: The columns of a step's `extras` [b, 5]: FreeU's b1, b2, s1, s2, then the step's PAG scale.
EXTRAS = ("b1", "b2", "s1", "s2", "pag")
#: What a step program may add to the UNet (ProgramKey.extras), in the order a label names them.
KINDS = ("freeu", "pag")


def step_extras_local(
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
    extras,
    *,
    cfg: bool,
    prediction_type: str,
    extra: tuple[str, ...],
):
    """`denoise.step_local` with FreeU and/or PAG (`extra`, static), + extras [b, 5]: with PAG the text's rows (and
    the cross-attention table) gain the conditional rows' perturbed copy, as diffusers' PAG pipeline prepares them."""
    rows, pag = latents.shape[0], "pag" in extra  # b: images on this device
    if pag:
        hidden, pooled, key_lengths = with_perturbed_rows((hidden, pooled, key_lengths), rows)
        if table_of(params) is not None:
            params = {**params, CROSS_KV: with_perturbed_rows(params[CROSS_KV], rows)}

    def call(sample, timesteps, added):
        copies = sample.shape[0] // rows  # FreeU's factors go to every row of an image: uncond, cond, perturbed
        with contextlib.ExitStack() as hooks:
            hooks.enter_context(unet_layers(params, index, cfg))
            if "freeu" in extra:
                hooks.enter_context(freeu(jnp.tile(extras[:, :FACTORS], (copies, 1))))
            if pag:
                hooks.enter_context(perturbed_attention(rows))
            return (
                modules.unet.apply(
                    {"params": params["unet"]}, sample, timesteps, encoder_hidden_states=hidden, added_cond_kwargs=added
                ).sample,
            )

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
        perturbed=extras[:, len(EXTRAS) - 1] if pag else None,
    )
