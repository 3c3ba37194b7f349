"""The hires fix's second pass on the host: its rows (A1111's step rule) and its fresh noise's seeds.

The second pass is image to image at the hires size (`image_plan.py`): its plan is the sampler's for
`schedule = int(requested / min(denoise, 0.999))` steps and the last `requested` of them run
(`contract/hires.second_pass_steps`, A1111's `setup_img2img_steps`), starting from the upscaled latents plus fresh
noise at that step's sigma. The noise is each image's own: its seed is the image's seed XOR `HIRES_SEED_MASK`, so an
image's pixels do not depend on the device count (image i alone is image 0 of a call with seed + i).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...contract.hires import second_pass_steps
from .image_plan import image_plan
from .sampler_plan import Plan

#: What an image's seed is XORed with for its second pass's noise (and Euler a's): fresh, a bijection, per image.
HIRES_SEED_MASK = 0x48495245  # "HIRE"


@dataclass(frozen=True)
class HiresPlan:
    """One request's second pass: where it runs and what."""

    size: tuple[int, int]  # (height, width): the hires size
    upscaler: str  # A1111's name of the upscaler (contract/hires.UPSCALERS)
    plan: Plan  # the rows that run: the last `steps` of a `schedule`-step plan
    schedule: int  # the steps the sampler's schedule was made for (steps ÷ denoise)
    refiner_row: int | None = None  # with the refiner: `plan`'s rows from this one are its (None: the base's alone)


def hires_plan(
    size: tuple[int, int],
    upscaler: str,
    steps: int,
    hires_steps: int,
    denoise: float,
    make_plan: Callable[[int, int], Plan],
) -> HiresPlan:
    """The second pass at `size`: `make_plan(schedule, first)` is the sampler's plan for `schedule` steps whose
    multistep history starts at step `first` (the first row run)."""
    schedule, run = second_pass_steps(steps, hires_steps, denoise)
    full = make_plan(schedule, schedule - run)
    return HiresPlan(size=size, upscaler=upscaler, plan=image_plan(full, run, pure_noise=False).plan, schedule=schedule)


def hires_seeds(seeds: list[int]) -> np.ndarray:
    """uint32 [B]: each image's second-pass seed."""
    return np.asarray(seeds, np.uint32) ^ np.uint32(HIRES_SEED_MASK)
