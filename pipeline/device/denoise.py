"""One denoising step on the device, for the images on one device: the initial noise, and UNet + guidance + the
sampler's update.

The host loops over the steps (`host/loop.py`) and tells each step its plan row (timestep, sigma and the update's
coefficients), so one step program serves every sampler and step count. The noise of image i comes from its own seed,
so an image does not depend on how many devices share the batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import attention, pag, sampler_update
from .image_prompt import unet_layers
from .modules import Modules
from .text import WINDOW

LATENT_CHANNELS = 4
#: Input channels of an inpainting UNet: latents (4), the mask (1), the masked picture's latents (4).
INPAINT_CHANNELS = 9


def initial_latents(seeds, height: int, width: int, vae_scale_factor: int):
    """Standard-normal noise, one independent draw per seed: uint32 [b] -> float32 [b, 4, h/8, w/8]."""
    shape = (LATENT_CHANNELS, height // vae_scale_factor, width // vae_scale_factor)
    keys = jax.vmap(jax.random.PRNGKey)(seeds)
    return jax.vmap(lambda key: jax.random.normal(key, shape, dtype=jnp.float32))(keys)


def time_ids(batch: int, height: int, width: int, dtype):
    """SDXL's size conditioning (original size, crop top-left, target size): [batch, 6]."""
    return jnp.array([[height, width, 0, 0, height, width]] * batch, dtype=dtype)


def start_local(seeds, init_sigma, image_latents, image_weight, *, height: int, width: int, vae_scale_factor: int):
    """Initial latents and each image's own standard-normal noise: (image_weight · x0 + init_sigma · n, n), float32
    [b, 4, h, w] each. txt2img: image_weight 0 (x0 is not read: exactly n × init_sigma); image to image: 1, with
    init_sigma the sigma of the first step run (diffusers' `add_noise`); each float32 [b] (each image its own: a merged
    call's requests) or []."""
    noise = initial_latents(seeds, height, width, vae_scale_factor)
    weighted = sampler_update.per_image(image_weight) * image_latents
    return weighted + sampler_update.per_image(init_sigma) * noise, noise


def step_local(
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
    *,
    cfg: bool,
    prediction_type: str,
):
    """One denoising step of any sampler: (latents, history) -> (latents', history'). Shapes: latents float32
    [b, 4, h, w], previous (the history, `sampler_update.history_update`) float32 [b, 4, 4, h, w], hidden
    [cb, K*77, D], pooled [cb, P], key_lengths int32 [cb] (the text keys each row attends to), guidance [b],
    seeds uint32 [b], `image` (see `unet_step`); coefficients float32 [b, 13] (each image's row of its
    `host/planning/sampler_plan.Plan`: a merged call's requests may run different samplers; [13]: one for all),
    blend_sigma float32 [b] (or []) and index int32 [], the row's number, the same on every device (c = 2 with
    classifier-free guidance, else 1).
    """

    def plain(sample, timesteps, added):
        with unet_layers(params, index, cfg):
            return (
                modules.unet.apply(
                    {"params": params["unet"]}, sample, timesteps, encoder_hidden_states=hidden, added_cond_kwargs=added
                ).sample,
            )

    return unet_step(
        plain,
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


def unet_step(
    unet_call,
    modules: Modules,
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
    time_ids_rows=None,
    perturbed=None,
):
    """`step_local` around any UNet call: `unet_call(sample, timesteps, added_cond_kwargs)` -> (noise, *extra);
    returns (latents', history', *extra). DeepCache's whole and shallow UNet calls (`device/deepcache.py`) go
    through it.

    `image` holds a request's picture, as diffusers' inpainting pipeline uses it: "latents" x0 and "noise" n
    [b, 4, h, w], "repaint" m [b, 1, h, w] (1 = repaint), "masked" [b, 4, h, w] (the masked picture's latents). A
    4-channel UNet's step is followed by the blend (1 - m)·(x0 + blend_sigma·n) + m·x', which with m = 1 (no mask,
    and txt2img) is x' exactly; a 9-channel inpainting UNet reads [x, m, masked] instead and is not blended.
    `time_ids_rows` [cb, n]: the UNet's time ids when they are not the base's size conditioning (the refiner's).
    `perturbed` float32 [b]: this step's PAG scale per image (`device/pag.py`): the UNet's rows gain the perturbed
    branch's b (the text's rows come with it), and its guidance is PAG's; None: no perturbed branch.
    """
    height, width = (size * modules.vae_scale_factor for size in latents.shape[2:])
    sigma = sampler_update.column(coefficients, 1)  # [] or [b, 1, 1, 1]
    model_input = sampler_update.scale_model_input(latents, sigma)  # [b, 4, h, w]
    inpainting_unet = modules.unet.in_channels == INPAINT_CHANNELS  # static
    if inpainting_unet:  # [b, 9, h, w]: diffusers' order
        model_input = jnp.concatenate([model_input, image["repaint"], image["masked"]], axis=1)
    model_input = unet_rows(model_input, cfg, perturbed is not None)  # [cb, c, h, w] (PAG: [(c + 1)b, c, h, w])
    ids = time_ids(hidden.shape[0], height, width, hidden.dtype) if time_ids_rows is None else time_ids_rows
    added = {"text_embeds": pooled, "time_ids": ids}
    one_window = hidden.shape[1] <= WINDOW  # static: with one window every key is the text's
    with attention.context_lengths(None if one_window else key_lengths):
        # float32 timesteps, as PyTorch feeds them
        noise, *extra = unet_call(model_input, unet_timesteps(coefficients, model_input.shape[0]), added)
    guidance = guidance.astype(jnp.float32)[:, None, None, None]  # [b, 1, 1, 1]
    noise = guided(noise.astype(jnp.float32), guidance, cfg, perturbed)  # [b, 4, h, w]
    # Only stochastic samplers use it (Euler a, DPM++ 2M SDE, LCM: d != 0); drawing it always keeps one program.
    keys = sampler_update.ancestral_keys(seeds)  # [b]
    fresh = sampler_update.ancestral_noise(keys, index, latents.shape[1:])  # [b, 4, h, w]
    # previous: the history [b, 4, 4, h, w] (its first array: the last step's D); returned updated in D's place
    updated, denoised = sampler_update.sampler_update(
        prediction_type, noise, latents, coefficients, previous[:, 0], fresh
    )
    updated, history = sampler_update.history_update(updated, latents, denoised, coefficients, previous)
    if not inpainting_unet:  # keep the picture outside the mask, re-noised to the next step's level
        repaint = image["repaint"]
        blend_sigma = sampler_update.per_image(blend_sigma)
        updated = (1 - repaint) * (image["latents"] + blend_sigma * image["noise"]) + repaint * updated
    return (updated, history, *extra)


def unet_rows(model_input, cfg: bool, perturbed: bool):
    """Each image's UNet rows: uncond and cond with CFG, + PAG's perturbed copy (`perturbed`)."""
    copies = (2 if cfg else 1) + perturbed
    return jnp.concatenate([model_input] * copies) if copies > 1 else model_input


def guided(noise, guidance, cfg: bool, perturbed):
    """The UNet rows' guided noise [b, ...]: classifier-free guidance, or PAG's with its step scale `perturbed` [b]."""
    if perturbed is None:
        return sampler_update.guide(noise, guidance, cfg)
    return pag.guide(noise, guidance, sampler_update.per_image(perturbed), cfg)


def unet_timesteps(coefficients, rows: int):
    """The timestep of each of the UNet's `rows` (c·b): the plan row's, or each image's from its own row, repeated
    for the guided batch's halves (unconditional first, as the latents are)."""
    if coefficients.ndim == 1:  # static: one row for every image
        return jnp.broadcast_to(coefficients[0], (rows,))
    timesteps = coefficients[:, 0]  # [b]
    return jnp.tile(timesteps, rows // timesteps.shape[0])  # [c·b]
