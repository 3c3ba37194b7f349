"""The engine as it ran before the host loop: the whole chain fused in one program (`fori_loop` over Euler steps).

Kept here, outside the engine, for one comparison: `python -m bench --only hostloop` times the host loop (one step
program per step, dispatched ahead) against this fused program on the same weights, size and steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..engine import Modules, SamplerConfig, decode, encode_each, initial_latents, sampler_update, time_ids, to_uint8

#: SDXL base's sampler (Euler, leading, steps_offset 1, CFG): what generate_from_latents uses unless told.
DEFAULT = SamplerConfig()


def euler_step(config: SamplerConfig, model_output, sample, sigma, sigma_next):
    """One Euler step (s_churn = 0, as diffusers' pipelines call it): float32 latents -> float32 latents."""
    denoised = sampler_update.predicted_original(config.prediction_type, model_output, sample, sigma)
    derivative = (sample - denoised) / sigma
    return sample + derivative * (sigma_next - sigma)


def ancestral_step(config: SamplerConfig, model_output, sample, sigma, sigma_up, sigma_down, noise):
    """One Euler-ancestral step: deterministic step to sigma_down, then fresh noise scaled by sigma_up."""
    denoised = sampler_update.predicted_original(config.prediction_type, model_output, sample, sigma)
    derivative = (sample - denoised) / sigma
    return sample + derivative * (sigma_down - sigma) + noise * sigma_up


def conditioning(
    modules: Modules, params, prompt_ids, negative_ids, has_negative, height: int, width: int, cfg: bool = True
):
    """UNet conditioning for classifier-free guidance, unconditional half first: ([2b, 77, D], added_cond_kwargs).

    Without CFG (static `cfg=False`) only the prompt is encoded: ([b, 77, D], ...).
    """
    both_ids = jnp.concatenate([negative_ids, prompt_ids], axis=0) if cfg else prompt_ids  # [2b or b, 2, 77]
    (hidden_1, hidden_2), pooled = encode_each(modules.text_encoder, modules.text_encoder_2, params, both_ids)
    hidden = jnp.concatenate([hidden_1, hidden_2], axis=-1)  # [N, 77, D1 + D2]
    # An empty negative prompt means "no negative": zero embeddings, as SDXL's reference does.
    keep = jnp.concatenate([has_negative, jnp.ones_like(has_negative)]) if cfg else jnp.ones_like(has_negative)
    hidden = jnp.where(keep[:, None, None], hidden, 0)  # [2b, 77, D]
    pooled = jnp.where(keep[:, None], pooled, 0)  # [2b, P]
    return hidden, {"text_embeds": pooled, "time_ids": time_ids(hidden.shape[0], height, width, hidden.dtype)}


def denoise(
    modules: Modules,
    params,
    latents,
    hidden,
    added_cond,
    guidance,
    steps: int,
    sampler: SamplerConfig = DEFAULT,
    seeds=None,
):
    """Euler (or Euler-ancestral) sampling with classifier-free guidance: float32 latents [b, 4, h, w] -> denoised.

    The timestep/sigma table is computed on the host (host/planning/sampler_plan.py) and baked in as constants; `seeds`
    uint32 [b] give each image its own ancestral noise. The served engine runs one step per program instead
    (`step_local`); this fused loop stays for the benchmark.
    """
    schedule = sampler.schedule(steps)
    timesteps, sigmas = jnp.asarray(schedule.timesteps), jnp.asarray(schedule.sigmas)  # [steps], [steps + 1]
    sigmas_up, sigmas_down = jnp.asarray(schedule.sigmas_up), jnp.asarray(schedule.sigmas_down)  # [steps]
    keys = sampler_update.ancestral_keys(seeds) if sampler.sampler == "euler_ancestral" else None  # [b]
    latents = latents * schedule.init_noise_sigma
    guidance = guidance.astype(jnp.float32)[:, None, None, None]  # [b, 1, 1, 1]

    def step(index, carry):
        latents = carry
        t, sigma = timesteps[index], sigmas[index]
        model_input = sampler_update.scale_model_input(latents, sigma)  # [b, 4, h, w]
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
        noise = sampler_update.guide(noise.astype(jnp.float32), guidance, sampler.cfg)  # [b, 4, h, w]
        if keys is None:
            latents = euler_step(sampler, noise, latents, sigma, sigmas[index + 1])
        else:
            fresh = sampler_update.ancestral_noise(keys, index, latents.shape[1:])  # [b, 4, h, w]
            latents = ancestral_step(sampler, noise, latents, sigma, sigmas_up[index], sigmas_down[index], fresh)
        return latents

    return jax.lax.fori_loop(0, steps, step, latents)


def generate_from_latents(
    modules,
    params,
    prompt_ids,
    negative_ids,
    has_negative,
    guidance,
    latents,
    *,
    steps: int,
    sampler=DEFAULT,
    seeds=None,
):
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
        modules,
        params,
        prompt_ids,
        negative_ids,
        has_negative,
        guidance,
        latents,
        steps=steps,
        sampler=sampler,
        seeds=seeds,
    )
    return to_uint8(image)
