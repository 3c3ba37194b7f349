"""SDXL's refiner on the device: its text (CLIP-G alone) and one step of its UNet (5 time ids, the aesthetic score).

As diffusers' `StableDiffusionXLImg2ImgPipeline` runs SDXL refiner 1.0: the text is text encoder 2's penultimate
hidden states (no encoder 1) and its pooled projection; an empty negative prompt is encoded as "" unless the
refiner's model_index.json zeroes it (`force_zeros_for_empty_prompt`, False for refiner 1.0); the UNet's time ids
are (original size, crop top-left, aesthetic score): (h, w, 0, 0, a), the negative half with the negative score.
The step is `denoise.unet_step` around the refiner's UNet, so every sampler's update and the picture's blend are
the base's, and the refiner continues the base's latents on the same schedule (host/planning/refiner_plan.py).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from .denoise import unet_step
from .modules import Modules
from .text import EXTRA_BASE, WINDOW, _inputs_with, emphasized


def refiner_encode_local(
    modules: Modules,
    params,
    prompt_ids,
    negative_ids,
    has_negative,
    windows,
    prompt_weights,
    negative_weights,
    extra_2,
    *,
    cfg: bool,
    normalize: bool = True,
    zero_empty_negative: bool = False,
):
    """Text encoder 2 over every 77-token window of the encoder-2 ids: ids [b, 2, K*77] (row 1 read) -> hidden
    [cb, K*77, D2], pooled [cb, P], key lengths [cb] int32; the unconditional half first (c = 2) or the prompt
    alone (static `cfg=False`). Emphasis weights and embedding vectors ([E, D2]) as `text.encode_local` uses them.
    Static `zero_empty_negative`: an empty negative prompt gives zero embeddings (else it is encoded as "")."""
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [cb, 2, K*77]
    both_weights = jnp.concatenate([negative_weights, prompt_weights], axis=0) if cfg else prompt_weights
    rows, length = both_ids.shape[0], both_ids.shape[-1]
    count = length // WINDOW  # K: static
    ids = both_ids[:, 1].reshape(rows * count, WINDOW)  # [cb*K, 77]
    weights = both_weights[:, 1].reshape(rows * count, WINDOW)
    is_extra = ids >= EXTRA_BASE
    vocabulary_ids = jnp.where(is_extra, 0, ids)
    table_rows = jnp.clip(ids - EXTRA_BASE, 0, extra_2.shape[0] - 1)
    with nn.intercept_methods(_inputs_with(is_extra, extra_2[table_rows])):
        out = modules.refiner_text_encoder_2.apply({"params": params["text_encoder_2"]}, vocabulary_ids)
    hidden = emphasized(out["hidden_states"][-2], weights, normalize)  # [cb*K, 77, D2]
    hidden = hidden.reshape(rows, count * WINDOW, hidden.shape[-1])  # [cb, K*77, D2]
    pooled = out["text_embeds"].reshape(rows, count, -1)[:, 0]  # [cb, P]: the first window's
    if zero_empty_negative:
        keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
        hidden = jnp.where(keep[:, None, None], hidden, 0)
        pooled = jnp.where(keep[:, None], pooled, 0)
    filled = jnp.concatenate([windows[:, 0], windows[:, 1]]) if cfg else windows[:, 1]  # [cb]
    return hidden, pooled, (filled * WINDOW).astype(jnp.int32)


def aesthetic_time_ids(batch: int, height: int, width: int, aesthetic, cfg: bool, dtype):
    """The refiner's size conditioning [c·batch, 5]: (h, w, 0, 0, score), the negative score on the unconditional
    half first (`aesthetic` float32 [2]: negative, positive)."""
    scores = (
        jnp.concatenate([jnp.full((batch,), aesthetic[0]), jnp.full((batch,), aesthetic[1])])
        if cfg
        else (jnp.full((batch,), aesthetic[1]))
    )
    size = jnp.broadcast_to(jnp.asarray([height, width, 0, 0], jnp.float32), (scores.shape[0], 4))
    return jnp.concatenate([size, scores[:, None].astype(jnp.float32)], axis=1).astype(dtype)


def refiner_step_local(
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
    aesthetic,
    *,
    cfg: bool,
    prediction_type: str,
):
    """One step of the refiner's UNet (`denoise.step_local`'s arguments, text from `refiner_encode_local`, plus
    `aesthetic` float32 [2]: the negative and the positive aesthetic score). Text encoded for guidance (2b rows)
    read by a step without it (static `cfg=False`: guidance ended) is its conditional half."""
    batch = latents.shape[0]
    if not cfg and hidden.shape[0] == 2 * batch:  # static: the conditional half
        hidden, pooled, key_lengths = hidden[batch:], pooled[batch:], key_lengths[batch:]
    height, width = (size * modules.vae_scale_factor for size in latents.shape[2:])
    ids = aesthetic_time_ids(batch, height, width, aesthetic, cfg, hidden.dtype)

    def refine(sample, timesteps, added):
        return (
            modules.refiner_unet.apply(
                {"params": params["refiner_unet"]},
                sample,
                timesteps,
                encoder_hidden_states=hidden,
                added_cond_kwargs=added,
            ).sample,
        )

    return unet_step(
        refine,
        dataclasses.replace(modules, unet=modules.refiner_unet),
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
        time_ids_rows=ids,
    )
