"""The sampler's update on the device, traced in float32: one step of any sampler from its plan row.

The host computes each sampler as per-step coefficients (`host/planning/sampler_plan.py`, `host/planning/solvers.py`);
the step program applies them here: x' = a·x + b·D + c·D_prev + d·noise, with D the denoised prediction, plus the
multistep samplers' older history (`history_update`). Guidance follows diffusers: g <= 1 means the conditional
prediction alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: The plan row's columns of DDIM's and LCM's clip_sample range (0: no clipping) and of the unclipped D's weight
#: (`host/planning/sampler_plan.COEFFICIENTS`).
CLIP, UNCLIPPED = 11, 12
#: Stream id folded into an image's key for its ancestral noise (its initial noise uses the key itself).
ANCESTRAL_STREAM = 1


def per_image(value):
    """A scalar, or one value per image [b] as [b, 1, 1, 1], to scale latents [b, ...]."""
    return value if value.ndim == 0 else value[:, None, None, None]


def column(coefficients, index: int):
    """Column `index` of the plan rows a step reads, to scale latents [b, ...]: a scalar from one row [13] (every
    image alike), [b, 1, 1, 1] from a row per image [b, 13] (a merged call's requests each on their own sampler)."""
    return per_image(coefficients[..., index])


def scale_model_input(latents, sigma):
    """The UNet sees latents / sqrt(sigma^2 + 1) (the Euler schedulers' `scale_model_input`)."""
    return latents / ((sigma**2 + 1) ** 0.5)


def guide(noise, guidance, cfg: bool):
    """Classifier-free guidance as diffusers defines it: g <= 1 -> the conditional prediction alone.

    noise: [2b, ...] (unconditional half first) when `cfg`, else [b, ...]; guidance: [b, 1, 1, 1] (traced).
    """
    if not cfg:
        return noise
    uncond, cond = jnp.split(noise, 2, axis=0)
    return jnp.where(guidance > 1, uncond + guidance * (cond - uncond), cond)


def predicted_original(prediction_type: str, model_output, sample, sigma):
    """x0 from the UNet's output: epsilon or v-prediction (as PyTorch's Euler schedulers)."""
    if prediction_type == "v_prediction":
        return model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
    return sample - sigma * model_output


def ancestral_keys(seeds):
    """Per-image keys of the ancestral noise: from the image's own seed, so no image depends on the others."""
    return jax.vmap(lambda seed: jax.random.fold_in(jax.random.PRNGKey(seed), ANCESTRAL_STREAM))(seeds)


def ancestral_noise(keys, index, shape):
    """Standard-normal noise for step `index` of each image: keys [b] -> float32 [b, *shape]."""
    return jax.vmap(lambda key: jax.random.normal(jax.random.fold_in(key, index), shape, dtype=jnp.float32))(keys)


def sampler_update(prediction_type: str, model_output, sample, coefficients, previous, noise):
    """One step of any sampler: (x', D) with D the denoised prediction and x' = a·x + b·D + c·D_prev + d·noise.

    coefficients: float32 [13] or, one per image, [b, 13] (COEFFICIENTS, a plan's row: the first six and the clip
    columns); previous: the last step's D (zeros at step 0).
    """
    sigma, a, b, c, d = (column(coefficients, i) for i in range(1, 6))  # the first six columns
    denoised = unclipped = predicted_original(prediction_type, model_output, sample, sigma)
    updated = 0.0
    if coefficients.shape[-1] > UNCLIPPED:  # static: a plan row (DDIM's and LCM's clip_sample: D within ±clip)
        clip = column(coefficients, CLIP)
        denoised = jnp.where(clip > 0, jnp.clip(unclipped, -clip, clip), unclipped)
        updated = column(coefficients, UNCLIPPED) * unclipped  # DDIM's noise direction: the model's, not clipped D's
    return updated + a * sample + b * denoised + c * previous + d * noise, denoised


def history_update(updated, sample, denoised, coefficients, history):
    """The older history's share of a step and the history the next step reads (UniPC, LMS; zero weights otherwise).

    history: float32 [b, 4, 4, h, w]: [the last D, the last three entries e]; coefficients [13] (a plan row): h1..h3
    weigh the entries, e = p·x + q·D is this step's (a row per image: [b, 13]). Returns (x' [b, 4, h, w],
    history' = [D, e, older two]).
    """
    h1, h2, h3, p, q = (column(coefficients, i) for i in range(6, 11))
    updated = updated + h1 * history[:, 1] + h2 * history[:, 2] + h3 * history[:, 3]
    entry = p * sample + q * denoised
    return updated, jnp.stack([denoised, entry, history[:, 1], history[:, 2]], axis=1)
