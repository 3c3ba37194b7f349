"""Reference images for the per-request speed levers (`cfg_end`, `deepcache`), from diffusers' PyTorch SDXL pipeline.

Needs torch and the `deepcache` package, so it runs only in the separate fixture environment, never in CI:

    /work/torchenv/bin/python scripts/make_speed_fixtures.py        # writes tests/fixtures/speed-expected.{npz,json}

On tests/fixtures/tiny-pt (float32, 64x64), each case starts from the engine's own initial noise for its seed
(`diffusion.initial_latents`, passed as `latents=`; the pipeline scales it by the scheduler's init sigma, as the
engine does):
- `cfg_end`: diffusers' documented dynamic-CFG callback (`callback_on_step_end`): at the end of step
  ⌈f × steps⌉ - 1 it sets `pipe._guidance_scale = 0.0` and keeps the conditional half of `prompt_embeds`,
  `add_text_embeds` and `add_time_ids`.
- `deepcache`: `DeepCache.DeepCacheSDHelper(pipe)`, `set_params(cache_interval=N, cache_branch_id=0)` (uniform
  mode), `enable()`.
- both: the same callback, which also keeps the conditional half of every output the helper has cached. Without
  that, stock DeepCache fails at the first guidance-free shallow step (its cached features have the CFG batch):
  the script checks that it does fail, so the fixture documents a real gap rather than a guess.
Per case the manifest also records what PyTorch actually ran at each step: the UNet's batch (2 = CFG) and whether
the whole UNet ran (DeepCache's down block 0 executed), for the host plan (`pipeline/host/planning/speed_plan.py`) to
match.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "fixtures"
CHECKPOINT = FIXTURES / "tiny-pt"
SIZE = 64
EMBEDDINGS = ["prompt_embeds", "add_text_embeds", "add_time_ids"]

#: (name, prompt, negative prompt or None, guidance, steps, sampler, cfg_end, deepcache interval, seed).
#: On the tiny random-weight checkpoint guidance acts mostly in the first steps (cfg_end 0.5 at guidance 5 moves
#: 1.6% of the pixels by 1 level: too close to the 1-level tolerance to check anything), so the cfg_end cases end
#: guidance early and guide harder; each case differs from the same request without levers on >= 20% of pixels.
CASES = [
    ("cfg_end_0.25_euler_8", "a lighthouse on a cliff at dusk", "blurry, low quality", 9.0, 8, "euler", 0.25, 1, 7),
    ("deepcache_3_euler_8", "a lighthouse on a cliff at dusk", None, 5.0, 8, "euler", 1.0, 3, 7),
    ("deepcache_2_dpmpp_2m_8", "a red fox in fresh snow", "blurry, low quality", 5.0, 8, "dpmpp_2m", 1.0, 2, 11),
    # Guidance ends after step 0, a whole-UNet step; steps 1 and 2 are shallow: the cached feature is halved.
    (
        "deepcache_3_cfg_end_0.125_euler_8",
        "a lighthouse on a cliff at dusk",
        "blurry, low quality",
        9.0,
        8,
        "euler",
        0.125,
        3,
        7,
    ),
    # Guidance ends after step 1; step 2 is a whole-UNet step: nothing cached is halved.
    ("deepcache_2_cfg_end_0.25_dpmpp_2m_8", "a red fox in fresh snow", None, 9.0, 8, "dpmpp_2m", 0.25, 2, 11),
]


def engine_noise(seed: int) -> np.ndarray:
    """The engine's standard-normal initial noise for `seed`: float32 [1, 4, 8, 8]."""
    from pipeline.device.denoise import initial_latents

    return np.array(initial_latents(np.asarray([seed], np.uint32), SIZE, SIZE, 8), np.float32)  # writable


def scheduler_for(config, sampler: str):
    from diffusers import DPMSolverMultistepScheduler, EulerDiscreteScheduler

    if sampler == "dpmpp_2m":
        return DPMSolverMultistepScheduler.from_config(config, algorithm_type="dpmsolver++", solver_order=2)
    return EulerDiscreteScheduler.from_config(config)


def guided_steps(steps: int, cfg_end: float) -> int:
    from pipeline.host.planning.speed_plan import guided_steps as host_guided_steps

    return host_guided_steps(steps, cfg_end)


def _halve(value):
    """The conditional half of a cached output (a tensor or nested tuples of them)."""
    if isinstance(value, torch.Tensor):
        return value.chunk(2)[-1]
    if isinstance(value, tuple | list):
        return type(value)(_halve(item) for item in value)
    return value


def dynamic_cfg(end_step: int, helper=None):
    """diffusers' documented callback turning guidance off after `end_step`; with `helper`, also DeepCache's cache."""

    def callback(pipe, step_index, timestep, callback_kwargs):
        if step_index == end_step:
            pipe._guidance_scale = 0.0
            for name in EMBEDDINGS:
                callback_kwargs[name] = callback_kwargs[name].chunk(2)[-1]
            if helper is not None:
                helper.cached_output = {key: _halve(value) for key, value in helper.cached_output.items()}
        return callback_kwargs

    return callback


#: The helper's key for SDXL's down block 0: it runs only on whole-UNet steps.
DOWN_BLOCK_0 = ("down", "block", 0, 0)


def record_steps(helper) -> tuple[list[dict], dict]:
    """Log each UNet call's batch and whether down block 0 really ran: (log, the helper's originals to put back).

    The helper's wrappers look their originals up in `function_dict` at call time, so wrapping those entries logs
    every call without touching the helper's logic.
    """
    log: list[dict] = []
    originals = {key: helper.function_dict[key] for key in ("unet_forward", DOWN_BLOCK_0)}

    def unet_call(*args, **kwargs):
        log.append({"batch": int(args[0].shape[0]), "full": False})
        return originals["unet_forward"](*args, **kwargs)

    def down_block_0(*args, **kwargs):
        log[-1]["full"] = True
        return originals[DOWN_BLOCK_0](*args, **kwargs)

    helper.function_dict.update({"unet_forward": unet_call, DOWN_BLOCK_0: down_block_0})
    return log, originals


def run_case(pipe, base_scheduler, case) -> tuple[np.ndarray, dict]:
    from DeepCache import DeepCacheSDHelper

    name, prompt, negative, guidance, steps, sampler, cfg_end, interval, seed = case
    pipe.scheduler = scheduler_for(base_scheduler.config, sampler)
    noise = engine_noise(seed)
    kwargs = dict(
        prompt=prompt,
        negative_prompt=negative,
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=SIZE,
        width=SIZE,
        latents=torch.from_numpy(noise),
        output_type="np",
        callback_on_step_end_tensor_inputs=EMBEDDINGS,
    )
    end_step = guided_steps(steps, cfg_end) - 1
    # Every case runs with the helper (interval 1: the whole UNet every step), so every case logs its steps alike.
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=interval, cache_branch_id=0, skip_mode="uniform")
    helper.enable()
    log, originals = record_steps(helper)
    try:
        if cfg_end < 1 and interval > 1:
            _check_stock(pipe, kwargs, end_step, interval, log)
            log.clear()  # the next call starts with a whole-UNet step: nothing kept carries over
        callback = dynamic_cfg(end_step, helper) if cfg_end < 1 else None
        with torch.no_grad():
            image = pipe(**kwargs, callback_on_step_end=callback).images  # float32 [1, 64, 64, 3]
    finally:
        helper.function_dict.update(originals)
        helper.disable()
    record = {
        "name": name,
        "prompt": prompt,
        "negative_prompt": negative,
        "guidance_scale": guidance,
        "steps": steps,
        "sampler": sampler,
        "cfg_end": cfg_end,
        "deepcache": interval,
        "seed": seed,
        "timesteps": [float(t) for t in pipe.scheduler.timesteps],
        "unet_batch": [entry["batch"] for entry in log],  # per step: 2 = CFG, 1 = guidance-free
        "full_unet": [entry["full"] for entry in log],  # per step: the whole UNet ran (else DeepCache's shallow)
    }
    return np.asarray(image, np.float32), record


def _check_stock(pipe, kwargs, end_step, interval, log) -> None:
    """Stock DeepCache + the documented callback: fails exactly when guidance ends right before a shallow step."""
    shallow_after = (end_step + 1) % interval != 0 and end_step + 1 < kwargs["num_inference_steps"]
    try:
        with torch.no_grad():
            pipe(**kwargs, callback_on_step_end=dynamic_cfg(end_step))
    except RuntimeError as error:
        if "Sizes of tensors must match" not in str(error) or not shallow_after:
            raise
        if len(log) - 1 != end_step + 1:
            raise
        print(f"  stock DeepCache + callback fails at step {len(log) - 1}: {str(error)[:100]}")
        return
    if shallow_after:
        raise AssertionError("stock DeepCache + the dynamic-CFG callback ran a guidance-free shallow step")
    print("  stock DeepCache + callback runs (guidance ends on a whole-UNet step)")


def main() -> None:
    from importlib.metadata import version

    import diffusers
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(str(CHECKPOINT), torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    base_scheduler = pipe.scheduler
    arrays, cases = {}, []
    for case in CASES:
        print(case[0])
        image, record = run_case(pipe, base_scheduler, case)
        arrays[case[0]] = image
        arrays[f"{case[0]}/noise"] = engine_noise(case[-1])
        cases.append(record)
    manifest = {
        "what": "diffusers' PyTorch StableDiffusionXLPipeline on tests/fixtures/tiny-pt (float32, 64x64) with the "
        "dynamic-CFG callback (cfg_end) and DeepCache's DeepCacheSDHelper (uniform, branch 0)",
        "height": SIZE,
        "width": SIZE,
        "noise": "npz key '<case>/noise': the engine's standard-normal noise for the seed, float32 [1, 4, 8, 8]",
        "images": "npz key = case name, float32 [1, 64, 64, 3] in [0, 1]",
        "scheduler": dict(base_scheduler.config),
        "cases": cases,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__, "DeepCache": version("DeepCache")},
    }
    np.savez_compressed(FIXTURES / "speed-expected.npz", **arrays)
    (FIXTURES / "speed-expected.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    print(f"wrote {FIXTURES / 'speed-expected.npz'} and .json")


if __name__ == "__main__":
    main()
