"""Regenerate the references of A1111's samplers and schedule types from diffusers' PyTorch schedulers and pipeline.

    /work/main/.venv/bin/python scripts/make_engine_noise.py                 # first: the engine's noise (JAX)
    /work/torchenv/bin/python scripts/make_a1111_sampler_fixtures.py         # needs torch + diffusers; never in CI
    /work/torchenv/bin/python scripts/make_a1111_sampler_fixtures.py --runs-only    # keep the images

Writes tests/fixtures/a1111-samplers.json (+ .npz):
- `schedules`: timesteps, sigmas and init_noise_sigma of each sampler × schedule type (A1111's names: `SCHEDULERS`
  below says which PyTorch scheduler and options each is) at 1, 2, 7, 8 and 25 steps, SDXL base's scheduler config;
- `runs`: whole runs on a fixed linear stand-in for the UNet, every row, from the first step and from a later one
  (`set_begin_index`, as image to image starts), the stochastic samplers' noise fed from fixed arrays (`start`,
  `noise`, `weight`: shared by every case);
- `images` (npz, by case name): diffusers' PyTorch `StableDiffusionXLPipeline` on tests/fixtures/tiny-pt (64x64,
  float32, guidance 6.5) with each new sampler × a schedule type or two at 6-8 steps, from the fixed latents of
  tiny-pt-expected.npz; DPM++ 2M SDE and LCM draw the engine's own noise (tests/fixtures/engine-noise.npz).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
OUT = FIXTURES / "a1111-samplers"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_sampler_fixtures import SDXL_BASE_SCHEDULER  # noqa: E402

SCHEDULE_OPTIONS = {
    "Automatic": {},
    "Karras": {"use_karras_sigmas": True},
    "Exponential": {"use_exponential_sigmas": True},
    "SGM Uniform": {"timestep_spacing": "trailing"},
}
#: A1111's sampler names -> diffusers' PyTorch scheduler class and its options (as A1111's names map to them).
SCHEDULERS = {
    "Euler": ("EulerDiscreteScheduler", {}),
    "Euler a": ("EulerAncestralDiscreteScheduler", {}),
    "DPM++ 2M": ("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "DPM++ 2M SDE": ("DPMSolverMultistepScheduler", {"algorithm_type": "sde-dpmsolver++", "solver_order": 2}),
    "UniPC": ("UniPCMultistepScheduler", {}),
    "DDIM": ("DDIMScheduler", {}),
    "Heun": ("HeunDiscreteScheduler", {}),
    "LMS": ("LMSDiscreteScheduler", {}),
    "LCM": ("LCMScheduler", {}),
}
#: (sampler, schedule type) pairs checked: every new sampler with its schedule types, the new types on the others.
PAIRS = [
    ("DPM++ 2M SDE", "Automatic"),
    ("DPM++ 2M SDE", "Karras"),
    ("DPM++ 2M SDE", "Exponential"),
    ("DPM++ 2M SDE", "SGM Uniform"),
    ("UniPC", "Automatic"),
    ("UniPC", "Karras"),
    ("UniPC", "Exponential"),
    ("UniPC", "SGM Uniform"),
    ("DDIM", "Automatic"),
    ("DDIM", "SGM Uniform"),
    ("Heun", "Automatic"),
    ("Heun", "Karras"),
    ("Heun", "Exponential"),
    ("Heun", "SGM Uniform"),
    ("LMS", "Automatic"),
    ("LMS", "Karras"),
    ("LMS", "Exponential"),
    ("LCM", "Automatic"),
    ("Euler", "Karras"),
    ("Euler", "Exponential"),
    ("Euler", "SGM Uniform"),
    ("Euler a", "SGM Uniform"),
    ("DPM++ 2M", "Exponential"),
    ("DPM++ 2M", "SGM Uniform"),
]
#: Pixel references: (sampler, schedule type, steps).
IMAGES = [
    ("DPM++ 2M SDE", "Karras", 8),
    ("DPM++ 2M SDE", "Automatic", 6),
    ("UniPC", "Automatic", 8),
    ("UniPC", "Exponential", 7),
    ("DDIM", "Automatic", 8),
    ("DDIM", "SGM Uniform", 6),
    ("Heun", "Automatic", 6),
    ("Heun", "Karras", 7),
    ("LMS", "Automatic", 8),
    ("LMS", "Karras", 7),
    ("LCM", "Automatic", 6),
    ("Euler", "Exponential", 8),
]
PROMPT, NEGATIVE, GUIDANCE = "a lighthouse on a cliff at dusk", "blurry, low quality", 6.5


def make(config: dict, sampler: str, schedule: str):
    import diffusers

    name, options = SCHEDULERS[sampler]
    return getattr(diffusers, name).from_config({**config, **SCHEDULE_OPTIONS[schedule]}, **options)


class FedNoise:
    """Replaces `randn_tensor` in the stochastic schedulers' modules: the k-th draw is `noise[k]`."""

    def __init__(self, noise: np.ndarray):
        self.noise, self.calls = noise, 0

    def __call__(self, shape, generator=None, device=None, dtype=None, layout=None):
        drawn = torch.from_numpy(self.noise[self.calls]).reshape(shape).to(dtype or torch.float32)
        self.calls += 1
        return drawn

    def __enter__(self):
        from diffusers.schedulers import (
            scheduling_dpmsolver_multistep,
            scheduling_euler_ancestral_discrete,
            scheduling_lcm,
        )

        self.modules = (scheduling_dpmsolver_multistep, scheduling_euler_ancestral_discrete, scheduling_lcm)
        self.saved = [module.randn_tensor for module in self.modules]
        for module in self.modules:
            module.randn_tensor = self
        return self

    def __exit__(self, *exc):
        for module, saved in zip(self.modules, self.saved, strict=True):
            module.randn_tensor = saved


def schedules() -> list[dict]:
    cases = []
    for sampler, schedule in PAIRS:
        for steps in (1, 2, 7, 8, 25):
            scheduler = make(SDXL_BASE_SCHEDULER, sampler, schedule)
            scheduler.set_timesteps(steps)
            sigmas = getattr(scheduler, "sigmas", None)
            cases.append(
                {
                    "sampler": sampler,
                    "schedule_type": schedule,
                    "steps": steps,
                    "timesteps": scheduler.timesteps.float().tolist(),
                    "sigmas": None if sigmas is None else sigmas.float().tolist(),
                    "init_noise_sigma": float(scheduler.init_noise_sigma),
                }
            )
    return cases


def runs() -> list[dict]:
    """Every row of a run with a linear 'model', from step 0 and from step 3 (image to image's begin index)."""
    rng = np.random.default_rng(2)
    start = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    noise = rng.standard_normal((20, 1, 4, 4, 4)).astype(np.float32)
    weight = np.float32(0.3)
    cases = []
    for sampler, schedule in [*PAIRS, ("DDIM", "Automatic clip_sample")]:
        for steps, first in ((7, 0), (8, 0), (8, 3)):
            if sampler == "LCM" and first:
                continue  # LCM's image to image picks other timesteps (strength): not served
            clipping = schedule.endswith(" clip_sample")  # DDIM's default (x0 within ±1), off in SDXL's config
            config = {**SDXL_BASE_SCHEDULER, "clip_sample": True} if clipping else SDXL_BASE_SCHEDULER
            scheduler = make(config, sampler, schedule.removesuffix(" clip_sample"))
            scheduler.set_timesteps(steps)
            timesteps = scheduler.timesteps[first * scheduler.order :]
            if first and hasattr(scheduler, "set_begin_index"):  # DDIM keeps no history: it has none
                scheduler.set_begin_index(first * scheduler.order)
            sample = torch.from_numpy(start) * (scheduler.init_noise_sigma if not first else 1.0)
            with FedNoise(noise):
                for t in timesteps:
                    model_input = scheduler.scale_model_input(sample, t)
                    output = weight * model_input + 0.01 * float(t) / 1000  # stands in for the UNet
                    sample = scheduler.step(output, t, sample).prev_sample
            cases.append(
                {
                    "sampler": sampler,
                    "schedule_type": schedule,
                    "steps": steps,
                    "first": first,
                    "final": sample.numpy().tolist(),
                }
            )
    return {"start": start.tolist(), "noise": noise.tolist(), "weight": float(weight), "cases": cases}


def images(only: tuple[str, ...] = ()) -> tuple[dict, list[dict]]:
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(str(FIXTURES / "tiny-pt"), torch_dtype=torch.float32)
    latents = np.load(FIXTURES / "tiny-pt-expected.npz")["latents"]  # [1, 4, 8, 8]
    noise = np.load(FIXTURES / "engine-noise.npz")["noise"]  # [rows, 1, 4, 8, 8]
    config = dict(pipe.scheduler.config)
    arrays, cases = {}, []
    for sampler, schedule, steps in IMAGES:
        name = f"{sampler}-{schedule}-{steps}".replace(" ", "_").replace("+", "p")
        if only and sampler not in only:
            continue
        # DDIM with SDXL base's clip_sample=False (tiny-pt's config has no such key: DDIM's default, True, would clip
        # x0 to ±1 in latent space); clipping itself is checked by `runs`.
        pipe.scheduler = make({**config, "clip_sample": False} if sampler == "DDIM" else config, sampler, schedule)
        with torch.no_grad(), FedNoise(noise):
            image = pipe(
                prompt=PROMPT,
                negative_prompt=NEGATIVE,
                num_inference_steps=steps,
                guidance_scale=GUIDANCE,
                height=64,
                width=64,
                latents=torch.from_numpy(latents),
                output_type="np",
            ).images
        arrays[name] = np.asarray(image, np.float32)  # [1, 64, 64, 3] in [0, 1]
        cases.append(
            {
                "name": name,
                "sampler": sampler,
                "schedule_type": schedule,
                "steps": steps,
                "timesteps": [float(t) for t in pipe.scheduler.timesteps],
                "clip_sample": bool(getattr(pipe.scheduler.config, "clip_sample", False)),
            }
        )
    return arrays, cases


def main() -> None:
    import diffusers

    if "--runs-only" in sys.argv[1:]:  # keep the committed images (5 minutes on 2 cores)
        data = json.loads(OUT.with_suffix(".json").read_text())
        data.update(schedules=schedules(), runs=runs())
        OUT.with_suffix(".json").write_text(json.dumps(data) + "\n")
        return
    if "--images" in sys.argv[1:]:  # only these samplers' images: --images DDIM,LMS
        only = tuple(sys.argv[sys.argv.index("--images") + 1].split(","))
        data = json.loads(OUT.with_suffix(".json").read_text())
        arrays = dict(np.load(OUT.with_suffix(".npz")))
        new_arrays, new_cases = images(only)
        arrays.update(new_arrays)
        data["images"] = [case for case in data["images"] if case["sampler"] not in only] + new_cases
        data["runs"] = runs()
        OUT.with_suffix(".json").write_text(json.dumps(data) + "\n")
        np.savez(OUT.with_suffix(".npz"), **arrays)
        return
    arrays, image_cases = images()
    data = {
        "what": "diffusers' PyTorch schedulers and StableDiffusionXLPipeline for A1111's samplers and schedule types "
        "(scripts/make_a1111_sampler_fixtures.py)",
        "versions": {"diffusers": diffusers.__version__, "torch": torch.__version__},
        "config": SDXL_BASE_SCHEDULER,
        "prompt": PROMPT,
        "negative_prompt": NEGATIVE,
        "guidance_scale": GUIDANCE,
        "schedules": schedules(),
        "runs": runs(),
        "images": image_cases,
    }
    OUT.with_suffix(".json").write_text(json.dumps(data) + "\n")
    np.savez(OUT.with_suffix(".npz"), **arrays)
    print(OUT, len(data["schedules"]), "schedules,", len(data["runs"]), "runs,", len(image_cases), "images")


if __name__ == "__main__":
    main()
