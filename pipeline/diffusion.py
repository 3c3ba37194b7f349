"""The device side of one generation, for the images on one device: text -> noise -> denoising steps -> VAE -> uint8.

The served programs (`programs.py`) are four per-device functions here: `encode_local` (both text encoders),
`start_local` (initial noise), `step_local` (one UNet call + guidance + any sampler's update) and `decode_local`
(VAE -> uint8); the host loops over the steps (`loop.py`), so only uint8 pixels leave the device. `generate_local`
keeps the whole chain fused in one `fori_loop` program (Euler only), as the engine served it before the host loop:
the benchmark compares the two.
The maths is diffusers' `FlaxStableDiffusionXLPipeline._generate`, with three changes that matter for serving:
the prompt and negative prompt are encoded in one batch, the noise of image i comes from its own seed (so an
image does not depend on how many devices share the batch), and an empty negative prompt is a traced flag
(zero embeddings, as the reference does for `neg_prompt_ids=None`) instead of a different program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from . import samplers
from .samplers import SamplerConfig
from .text import encode_prompts

LATENT_CHANNELS = 4
#: SDXL base's sampler (Euler, leading, steps_offset 1, CFG): what generate_from_latents uses unless told.
DEFAULT = SamplerConfig()


@dataclass(frozen=True)
class Modules:
    """diffusers' stateless module objects; the weights travel separately as `params`."""

    text_encoder: Any  # FlaxCLIPTextModel
    text_encoder_2: Any  # FlaxCLIPTextModelWithProjection
    unet: Any  # FlaxUNet2DConditionModel
    vae: Any  # FlaxAutoencoderKL
    scheduler: Any  # FlaxEulerDiscreteScheduler (its state lives in params["scheduler"])
    vae_scale_factor: int  # 8 for SDXL: pixels per latent

    @classmethod
    def of(cls, pipeline) -> Modules:
        return cls(
            text_encoder=pipeline.text_encoder,
            text_encoder_2=pipeline.text_encoder_2,
            unet=pipeline.unet,
            vae=pipeline.vae,
            scheduler=pipeline.scheduler,
            vae_scale_factor=pipeline.vae_scale_factor,
        )


def initial_latents(seeds, height: int, width: int, vae_scale_factor: int):
    """Standard-normal noise, one independent draw per seed: uint32 [b] -> float32 [b, 4, h/8, w/8]."""
    shape = (LATENT_CHANNELS, height // vae_scale_factor, width // vae_scale_factor)
    keys = jax.vmap(jax.random.PRNGKey)(seeds)
    return jax.vmap(lambda key: jax.random.normal(key, shape, dtype=jnp.float32))(keys)


def time_ids(batch: int, height: int, width: int, dtype):
    """SDXL's size conditioning (original size, crop top-left, target size): [batch, 6]."""
    return jnp.array([[height, width, 0, 0, height, width]] * batch, dtype=dtype)


def conditioning(
    modules: Modules, params, prompt_ids, negative_ids, has_negative, height: int, width: int, cfg: bool = True
):
    """UNet conditioning for classifier-free guidance, unconditional half first: ([2b, 77, D], added_cond_kwargs).

    Without CFG (static `cfg=False`) only the prompt is encoded: ([b, 77, D], ...).
    """
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [2b or b, 2, 77]
    hidden, pooled = encode_prompts(modules.text_encoder, modules.text_encoder_2, params, both_ids)
    # An empty negative prompt means "no negative": zero embeddings, as SDXL's reference does.
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
    hidden = jnp.where(keep[:, None, None], hidden, 0)  # [2b, 77, D]
    pooled = jnp.where(keep[:, None], pooled, 0)  # [2b, P]
    return hidden, {"text_embeds": pooled, "time_ids": time_ids(hidden.shape[0], height, width, hidden.dtype)}


def denoise(
    modules: Modules, params, latents, hidden, added_cond, guidance, steps: int, sampler: SamplerConfig = DEFAULT,
    seeds=None,
):  # fmt: skip
    """Euler (or Euler-ancestral) sampling with classifier-free guidance: float32 latents [b, 4, h, w] -> denoised.

    The timestep/sigma table is computed on the host (samplers.py) and baked in as constants; `seeds` uint32 [b]
    give each image its own ancestral noise. The served engine runs one step per program instead (`step_local`);
    this fused loop stays for the benchmark and the reference tests.
    """
    schedule = sampler.schedule(steps)
    timesteps, sigmas = jnp.asarray(schedule.timesteps), jnp.asarray(schedule.sigmas)  # [steps], [steps + 1]
    sigmas_up, sigmas_down = jnp.asarray(schedule.sigmas_up), jnp.asarray(schedule.sigmas_down)  # [steps]
    keys = samplers.ancestral_keys(seeds) if sampler.sampler == "euler_ancestral" else None  # [b]
    latents = latents * schedule.init_noise_sigma
    guidance = guidance.astype(jnp.float32)[:, None, None, None]  # [b, 1, 1, 1]

    def step(index, carry):
        latents = carry
        t, sigma = timesteps[index], sigmas[index]
        model_input = samplers.scale_model_input(latents, sigma)  # [b, 4, h, w]
        if sampler.cfg:
            model_input = jnp.concatenate([model_input, model_input])  # [2b, 4, h, w]
        timestep = jnp.broadcast_to(t, model_input.shape[:1])  # float32, as PyTorch feeds it
        noise = modules.unet.apply(
            {"params": params["unet"]},
            model_input,
            timestep,
            encoder_hidden_states=hidden,
            added_cond_kwargs=added_cond,
        ).sample
        noise = samplers.guide(noise.astype(jnp.float32), guidance, sampler.cfg)  # [b, 4, h, w]
        if keys is None:
            latents = samplers.euler_step(sampler, noise, latents, sigma, sigmas[index + 1])
        else:
            fresh = samplers.ancestral_noise(keys, index, latents.shape[1:])  # [b, 4, h, w]
            latents = samplers.ancestral_step(
                sampler, noise, latents, sigma, sigmas_up[index], sigmas_down[index], fresh
            )
        return latents

    return jax.lax.fori_loop(0, steps, step, latents)


def decode(modules: Modules, params, latents):
    """VAE decode to pixels in [0, 1]: float32 [b, H, W, 3]."""
    latents = latents / modules.vae.config.scaling_factor
    image = modules.vae.apply({"params": params["vae"]}, latents, method=modules.vae.decode).sample
    return (image / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1).astype(jnp.float32)


def to_uint8(image):
    """[0, 1] floats -> uint8, rounding to nearest (4x fewer bytes to bring back to the host)."""
    return jnp.round(image * 255).astype(jnp.uint8)


def generate_from_latents(
    modules, params, prompt_ids, negative_ids, has_negative, guidance, latents, *, steps: int, sampler=DEFAULT,
    seeds=None,
):  # fmt: skip
    """Images in [0, 1] for given initial latents: text encoders -> denoising loop -> VAE decode."""
    height, width = (size * modules.vae_scale_factor for size in latents.shape[2:])
    hidden, added_cond = conditioning(
        modules, params, prompt_ids, negative_ids, has_negative, height, width, cfg=sampler.cfg
    )
    latents = denoise(modules, params, latents, hidden, added_cond, guidance, steps, sampler, seeds)
    return decode(modules, params, latents)


def generate_local(
    modules, params, prompt_ids, negative_ids, has_negative, guidance, seeds, *, height, width, steps, sampler=DEFAULT
):
    """The per-device program: seeds uint32 [b] (+ ids [b, 2, 77], flags [b], guidance [b]) -> uint8 [b, H, W, 3]."""
    latents = initial_latents(seeds, height, width, modules.vae_scale_factor)
    image = generate_from_latents(
        modules, params, prompt_ids, negative_ids, has_negative, guidance, latents, steps=steps, sampler=sampler,
        seeds=seeds,
    )  # fmt: skip
    return to_uint8(image)


# ---- the served programs' per-device bodies (the host loop calls them one step at a time) ------------------------


def encode_local(modules: Modules, params, prompt_ids, negative_ids, has_negative, *, cfg: bool):
    """Both text encoders: ids [b, 2, 77] -> (hidden [2b or b, 77, D], pooled [2b or b, P]), unconditional first."""
    hidden, added = conditioning(modules, params, prompt_ids, negative_ids, has_negative, 0, 0, cfg=cfg)
    return hidden, added["text_embeds"]


def start_local(seeds, init_sigma, *, height: int, width: int, vae_scale_factor: int):
    """Initial latents: each image's own standard-normal noise × the plan's init sigma: float32 [b, 4, h, w]."""
    return initial_latents(seeds, height, width, vae_scale_factor) * init_sigma


def step_local(
    modules: Modules, params, latents, previous, hidden, pooled, guidance, seeds, coefficients, index, *,
    cfg: bool, prediction_type: str,
):  # fmt: skip
    """One denoising step of any sampler: (latents, D) -> (latents', D). Shapes: latents/previous float32
    [b, 4, h, w], hidden [2b or b, 77, D], pooled [2b or b, P], guidance [b], seeds uint32 [b]; coefficients
    float32 [6] (one row of a `samplers.Plan`) and index int32 [] are the same on every device.
    """
    height, width = (size * modules.vae_scale_factor for size in latents.shape[2:])
    timestep, sigma = coefficients[0], coefficients[1]
    model_input = samplers.scale_model_input(latents, sigma)  # [b, 4, h, w]
    if cfg:
        model_input = jnp.concatenate([model_input, model_input])  # [2b, 4, h, w]
    noise = modules.unet.apply(
        {"params": params["unet"]},
        model_input,
        jnp.broadcast_to(timestep, model_input.shape[:1]),  # float32, as PyTorch feeds it
        encoder_hidden_states=hidden,
        added_cond_kwargs={"text_embeds": pooled, "time_ids": time_ids(hidden.shape[0], height, width, hidden.dtype)},
    ).sample
    guidance = guidance.astype(jnp.float32)[:, None, None, None]  # [b, 1, 1, 1]
    noise = samplers.guide(noise.astype(jnp.float32), guidance, cfg)  # [b, 4, h, w]
    # Only ancestral samplers use it (coefficient d != 0); drawing it always keeps one program for every sampler.
    fresh = samplers.ancestral_noise(samplers.ancestral_keys(seeds), index, latents.shape[1:])  # [b, 4, h, w]
    return samplers.sampler_update(prediction_type, noise, latents, coefficients, previous, fresh)


def decode_local(modules: Modules, params, latents):
    """VAE decode of the final latents: float32 [b, 4, h, w] -> uint8 [b, H, W, 3]."""
    return to_uint8(decode(modules, params, latents))
