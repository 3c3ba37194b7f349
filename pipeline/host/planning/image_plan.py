"""Where an image request's denoising starts: the rows of the sampler plan that run, and the start latents.

As diffusers' PyTorch `StableDiffusionXLImg2ImgPipeline` and `StableDiffusionXLInpaintPipeline` (4-channel UNet) do
it, with the VAE posterior's mean x0 and each image's own noise n, in the engine's variance-exploding scale
(x = x0 + sigma·noise, for every sampler):

    P   = the full plan, as txt2img runs it
    run = min(int(steps × strength), steps);  t = steps - run   diffusers' `get_timesteps` + `set_begin_index(t)`
    x   = x0 + P.sigmas[t]·n      `add_noise` at the first step run (DPM's alpha·x0 + sigma_t·n: the same point)
    x   = P.init_sigma·n          instead in the inpainting pipeline at strength 1 (pure noise, exactly txt2img's)
    rows t.. of P run; in the first one D_prev's weight is folded into D's (a multistep solver has no history at the
    first step it runs: DPM++ 2M's `lower_order_nums` counts from there; its last step stays first order)

diffusers' img2img pipeline keeps a trace of the image at strength 1 (x0 + sigma_max·n); its inpainting pipeline
starts from pure noise there. Which a request follows is `pure_noise_at_full_strength` (a mask, or an inpainting
UNet). Checked against diffusers' pipelines for Euler, Euler a, DPM++ 2M and DPM++ 2M Karras
(tests/fixtures/image-expected.*).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .sampler_plan import Plan


@dataclass(frozen=True)
class ImagePlan:
    """One image request's sampling: the rows of the full plan that run, and how its start latents are made."""

    plan: Plan  # the rows that run (steps = run); init_sigma = the noise's scale in the start latents
    image_weight: float  # start latents = image_weight·x0 + plan.init_sigma·n: 1.0, or 0.0 for pure noise


def image_plan(full: Plan, steps_run: int, *, pure_noise: bool) -> ImagePlan:
    """The last `steps_run` rows of `full` (`image_inputs.steps_to_run` checked there are some), with pure noise
    for an inpainting request at full strength."""
    start = full.steps - steps_run
    row = start * full.order  # Heun's steps are two rows each (diffusers: timesteps[t_start * order:])
    coefficients = full.coefficients[row:].copy()  # float32 [rows run, 13]
    first = coefficients[0]
    if first[4] != 0:  # a second-order row: with no history, D_prev = D, i.e. b + c on D
        first[3] = np.float32(np.float64(first[3]) + np.float64(first[4]))
        first[4] = 0.0
    pure = pure_noise and start == 0
    plan = dataclasses.replace(
        full,
        steps=steps_run,
        init_sigma=full.init_sigma if pure else float(full.sigmas[row]),
        timesteps=full.timesteps[row:].copy(),
        sigmas=full.sigmas[row:].copy(),
        coefficients=coefficients,
    )
    return ImagePlan(plan=plan, image_weight=0.0 if pure else 1.0)
