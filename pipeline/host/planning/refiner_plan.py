"""Where a request's refiner takes over: A1111's "Switch at" as diffusers' `denoising_end` / `denoising_start`.

    cutoff = round(T - switch × T)        T: the training timesteps (1000)
    base   = the steps whose timestep >= cutoff   (`StableDiffusionXLPipeline(denoising_end=switch)`)
    refiner: the steps after them, from the base's noisy latents, on the same schedule, with no re-noising
             (`StableDiffusionXLImg2ImgPipeline(denoising_start=switch)`: `get_timesteps` + `set_begin_index`)

The refiner's scheduler is a fresh one begun at the switch, so a multistep sampler's history restarts there (its
first row folds D_prev into D, as `image_plan` does for a picture's first step). Both stages' rows are one plan: the
loop runs rows from `switch_row` on with the refiner's step program (host/loop.py). A switch of 1 (or one whose
cutoff leaves the refiner no step) runs the base alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .image_plan import image_plan
from .sampler_plan import Plan

#: refiner_switch of a request that runs no refiner (A1111's "Switch at" 1).
OFF = 1.0


@dataclass(frozen=True)
class RefinerPlan:
    """One request's two stages: the rows both run, and the first row of the refiner's."""

    plan: Plan  # the base's rows up to the switch, then the refiner's (its history restarted)
    switch_row: int  # plan rows from this one run the refiner (plan.rows: none do)
    base_steps: int  # the steps the base runs


def base_steps(plan: Plan, switch: float, num_train_timesteps: int) -> int:
    """How many of `plan`'s steps the base runs before `switch` (diffusers' `denoising_end` rule)."""
    if switch >= OFF:
        return plan.steps
    cutoff = int(round(num_train_timesteps - switch * num_train_timesteps))
    step_timesteps = plan.timesteps[:: plan.order][: plan.steps]  # each step's first row
    return int(np.sum(step_timesteps >= cutoff))


def refiner_plan(plan: Plan, switch: float, num_train_timesteps: int, restarted: Callable[[int], Plan]) -> RefinerPlan:
    """`plan` (the rows a request runs) split at `switch`; `restarted(k)` is the request's whole plan with its
    multistep history starting at its k-th step run (`run_plan.cached_plan(..., first=...)`, from which the refiner's
    rows are taken)."""
    steps = base_steps(plan, switch, num_train_timesteps)
    if steps >= plan.steps:
        return RefinerPlan(plan=plan, switch_row=plan.rows, base_steps=plan.steps)
    row = steps * plan.order
    later = image_plan(restarted(steps), plan.steps - steps, pure_noise=False).plan  # its rows: the refiner's
    coefficients = np.concatenate([plan.coefficients[:row], later.coefficients])  # float32 [rows, 13]
    return RefinerPlan(plan=dataclasses.replace(plan, coefficients=coefficients), switch_row=row, base_steps=steps)
