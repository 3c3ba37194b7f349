"""Regenerate tests/fixtures/sampler_schedules.json from diffusers' PyTorch Euler and DPM-Solver++ schedulers.

    /work/torchenv/bin/python scripts/make_sampler_fixtures.py    # needs torch + diffusers; never run by CI

Timesteps, sigmas and init_noise_sigma of `EulerDiscreteScheduler` and `EulerAncestralDiscreteScheduler` for SDXL
base's scheduler config, each spacing, 1/2/4/8/25 steps, epsilon and v-prediction; plus one `step` of each
scheduler on fixed arrays (the ancestral one with its noise saved), so CI checks the engine's arithmetic without torch;
and for DPM++ 2M (with and without Karras sigmas; dpmsolver++, order 2) the timesteps and sigmas of each spacing and
whole runs on a fixed linear stand-in for the UNet (every step, so the multistep history is checked).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from diffusers import DPMSolverMultistepScheduler, EulerAncestralDiscreteScheduler, EulerDiscreteScheduler

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sampler_schedules.json"

#: stabilityai/stable-diffusion-xl-base-1.0 scheduler/scheduler_config.json
SDXL_BASE_SCHEDULER = {
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}
CLASSES = {"euler": EulerDiscreteScheduler, "euler_ancestral": EulerAncestralDiscreteScheduler}
#: DPM++ 2M as A1111 names it: dpmsolver++, order 2, midpoint; "Karras" = use_karras_sigmas.
DPM = {"dpmpp_2m": {"use_karras_sigmas": False}, "dpmpp_2m_karras": {"use_karras_sigmas": True}}


def make_dpm(sampler: str, **overrides):
    return DPMSolverMultistepScheduler.from_config(
        {**SDXL_BASE_SCHEDULER, **overrides}, algorithm_type="dpmsolver++", solver_order=2, **DPM[sampler]
    )


def make(cls, **overrides):
    return cls.from_config({**SDXL_BASE_SCHEDULER, **overrides})


def schedules() -> list[dict]:
    cases = []
    for sampler, cls in CLASSES.items():
        for spacing in ("leading", "linspace", "trailing"):
            for prediction in ("epsilon", "v_prediction"):
                for steps in (1, 2, 4, 8, 25):
                    scheduler = make(cls, timestep_spacing=spacing, prediction_type=prediction)
                    scheduler.set_timesteps(steps)
                    cases.append(_schedule_case(scheduler, sampler, spacing, prediction, steps, 1))
        for steps in (4, 25):  # PyTorch's own default offset (0): only `leading` uses it
            scheduler = make(cls, timestep_spacing="leading", steps_offset=0)
            scheduler.set_timesteps(steps)
            cases.append(_schedule_case(scheduler, sampler, "leading", "epsilon", steps, 0))
    for sampler in DPM:
        for spacing in ("leading", "linspace", "trailing"):
            for steps in (1, 2, 4, 8, 25, 50):
                scheduler = make_dpm(sampler, timestep_spacing=spacing)
                scheduler.set_timesteps(steps)
                cases.append(_schedule_case(scheduler, sampler, spacing, "epsilon", steps, 1))
    return cases


def _schedule_case(scheduler, sampler: str, spacing: str, prediction: str, steps: int, offset: int) -> dict:
    return {
        "sampler": sampler,
        "timestep_spacing": spacing,
        "prediction_type": prediction,
        "steps": steps,
        "steps_offset": offset,
        "timesteps": scheduler.timesteps.float().tolist(),
        "sigmas": scheduler.sigmas.float().tolist(),
        "init_noise_sigma": float(scheduler.init_noise_sigma),
    }


def steps() -> list[dict]:
    """One step of each scheduler (4 trailing steps, at step index 1) on fixed arrays."""
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((1, 4, 4, 4)).astype(np.float32) * 5
    model_output = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    noise = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    cases = []
    for sampler, cls in CLASSES.items():
        for prediction in ("epsilon", "v_prediction"):
            scheduler = make(cls, timestep_spacing="trailing", prediction_type=prediction)
            scheduler.set_timesteps(4)
            scheduler.set_begin_index(1)
            t = scheduler.timesteps[1]
            scaled = scheduler.scale_model_input(torch.from_numpy(sample), t)
            generator = None
            if sampler == "euler_ancestral":
                # Feed our noise: randn_tensor draws from this generator; replay the same draw here.
                generator = torch.Generator().manual_seed(1234)
                drawn = torch.randn((1, 4, 4, 4), generator=torch.Generator().manual_seed(1234))
                noise_used = drawn.numpy()
            else:
                noise_used = noise
            out = scheduler.step(torch.from_numpy(model_output), t, torch.from_numpy(sample), generator=generator)
            cases.append(
                {
                    "sampler": sampler,
                    "prediction_type": prediction,
                    "steps": 4,
                    "index": 1,
                    "sample": sample.tolist(),
                    "model_output": model_output.tolist(),
                    "noise": noise_used.tolist(),
                    "scaled_input": scaled.numpy().tolist(),
                    "prev_sample": out.prev_sample.numpy().tolist(),
                }
            )
    return cases


def dpm_runs() -> list[dict]:
    """Whole DPM++ 2M runs (every step, so the multistep history counts) on a fixed linear 'model'."""
    rng = np.random.default_rng(1)
    start = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    weight = np.float32(0.3)
    cases = []
    for sampler in DPM:
        for prediction in ("epsilon", "v_prediction"):
            for steps in (1, 3, 8):
                scheduler = make_dpm(sampler, timestep_spacing="leading", prediction_type=prediction)
                scheduler.set_timesteps(steps)
                sample = torch.from_numpy(start) * scheduler.init_noise_sigma
                for t in scheduler.timesteps:
                    model_input = scheduler.scale_model_input(sample, t)
                    output = weight * model_input + 0.01 * float(t) / 1000  # stands in for the UNet
                    sample = scheduler.step(output, t, sample).prev_sample
                cases.append(
                    {
                        "sampler": sampler,
                        "prediction_type": prediction,
                        "steps": steps,
                        "start": start.tolist(),
                        "weight": float(weight),
                        "final": sample.numpy().tolist(),
                    }
                )
    return cases


def main() -> None:
    import diffusers

    data = {
        "what": "diffusers' PyTorch Euler and DPM++ 2M schedulers, SDXL base's scheduler config "
        "(scripts/make_sampler_fixtures.py)",
        "diffusers": diffusers.__version__,
        "torch": torch.__version__,
        "config": SDXL_BASE_SCHEDULER,
        "schedules": schedules(),
        "steps": steps(),
        "dpm_runs": dpm_runs(),
    }
    OUT.write_text(json.dumps(data) + "\n")
    print(OUT, len(data["schedules"]), "schedules,", len(data["steps"]), "steps")


if __name__ == "__main__":
    main()
