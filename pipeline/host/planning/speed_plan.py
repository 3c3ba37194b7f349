"""Per-request speed levers on the host: guidance for the first part of the steps (`cfg_end`), DeepCache (`deepcache`).

    plan = speed_plan(steps=30, cfg_end=0.5, deepcache=3, cfg=True)
    for step in plan.schedule:      # one entry per step the loop runs, in order
        step.cfg, step.full         # which step program: CFG or guidance-free, whole UNet or shallow
        step.drop_uncond            # before it: hidden/pooled -> their conditional half (guidance just ended)
        step.halve_feature          # before it: the kept DeepCache feature -> its conditional half

Both follow what diffusers' PyTorch SDXL pipeline does, so the pictures can be checked against it:
- `cfg_end` f (0 < f <= 1): classifier-free guidance on the first ⌈f × n⌉ of the n steps run, then none. diffusers
  documents this as a `callback_on_step_end` that, at the end of step ⌈f × n⌉ - 1, sets `_guidance_scale = 0` and
  keeps the conditional half of `prompt_embeds`, `add_text_embeds` and `add_time_ids`: the guidance-free steps see
  the very embeddings the CFG steps saw (not a new encoding of the prompt alone).
- `deepcache` N (the `deepcache` package's `DeepCacheSDHelper`, uniform mode, branch 0): the whole UNet on the
  steps with (i - first) % N == 0, the shallow UNet on the others, fed with the feature the last whole-UNet step
  kept (`deepcache.py`). N = 1 is off.
- Both at once: when guidance ends between a whole-UNet step and a shallow one, the kept feature has the CFG
  batch (uncond rows, cond rows) and the shallow step the guidance-free batch. Stock DeepCache + the documented
  callback then fail in PyTorch (`torch.cat` in the last up block: "Sizes of tensors must match ... Expected size 2
  but got size 1"). The engine keeps the conditional half of the feature, which is what the conditional rows
  computed at that whole-UNet step, and exactly what PyTorch does when the callback also halves the helper's
  `cached_output` (scripts/make_speed_fixtures.py makes that reference). No extra whole-UNet step is run.

Step indices: the loop runs steps `first .. steps - 1` of the sampler's plan (`first` > 0 when a picture starts
part-way, as img2img does); n = steps - first, and both levers count from `first`, as PyTorch does (its callback's
`step_index` and DeepCache's `cur_timestep - start_timestep` both count the steps run). One known difference:
the PyTorch helper finds a step's index by looking its timestep up in `scheduler.timesteps` (DeepCache/extension/
deepcache.py, l. 41), which takes the first of repeated timesteps; DPM++ 2M Karras repeats some from 45 steps on
(SDXL's schedule), so there PyTorch's whole/shallow pattern drifts from (i - first) % N. Here the index is the step's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def guided_steps(steps_run: int, cfg_end: float) -> int:
    """⌈cfg_end × steps_run⌉: how many of the steps run use guidance (at least 1).

    Rounded to 9 decimals first, so 0.3 × 10 is 3, not the 4 that 3.0000000000000004 would give.
    """
    return max(1, math.ceil(round(cfg_end * steps_run, 9)))


@dataclass(frozen=True)
class PlannedStep:
    """What the host loop does at one step."""

    index: int  # the step's row in the sampler plan (first .. steps - 1)
    cfg: bool  # the CFG step program (2b UNet rows) rather than the guidance-free one (b rows)
    full: bool  # the whole UNet (keeps a new feature) rather than the shallow one (uses the kept feature)
    drop_uncond: bool  # before this step: keep the conditional half of hidden and pooled (guidance just ended)
    halve_feature: bool  # before this step: keep the conditional half of the kept feature (it is from a CFG step)


@dataclass(frozen=True)
class SpeedPlan:
    """One request's levers, step by step."""

    steps: int  # the plan's rows that run (with a picture: only those, `image_plan.py`)
    cfg_end: float  # the fraction of the steps run with guidance (1 = all)
    interval: int  # DeepCache's N (1 = off)
    schedule: tuple[PlannedStep, ...]  # one entry per step run, in order

    @property
    def guided_steps(self) -> int:
        return sum(step.cfg for step in self.schedule)


def speed_plan(
    steps: int, cfg_end: float = 1.0, deepcache: int = 1, *, cfg: bool = True, guided: bool = True
) -> SpeedPlan:
    """The per-step program choice for a request whose plan runs `steps` rows (a picture's plan holds only the rows
    that run, so both levers count from its first step).

    `cfg`: whether the texts come as a CFG batch (the server's CFG programs); without it `cfg_end` changes nothing.
    `guided`: whether the request asks for guidance at all (guidance > 1). A CFG batch that asks for none keeps its
    conditional half before the first step and runs every step guidance-free: the CFG program would compute the
    unconditional half only to drop it (`sampler_update.guide`), twice the UNet work for the same pixels. The levers
    come checked from the request (`fields.FIELDS`); `steps` from the host's own plan.
    """
    interval = deepcache
    run = steps
    guided = (guided_steps(run, cfg_end) if guided else 0) if cfg else 0
    schedule = []
    feature_cfg = None  # the CFG mode of the kept feature (None: nothing kept yet)
    for j in range(run):
        step_cfg = j < guided
        full = j % interval == 0
        halve = not full and feature_cfg is True and not step_cfg
        schedule.append(
            PlannedStep(index=j, cfg=step_cfg, full=full, drop_uncond=cfg and j == guided, halve_feature=halve)
        )
        if full:
            feature_cfg = step_cfg
        elif halve:
            feature_cfg = False
    return SpeedPlan(steps=steps, cfg_end=cfg_end, interval=interval, schedule=tuple(schedule))
