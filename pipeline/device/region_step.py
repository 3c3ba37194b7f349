"""The denoising step of a regional prompt: `denoise.step_local` with the blend weights entered around it
(`device/regions.py`), so every cross-attention of the UNet blends the prompt's parts."""

from __future__ import annotations

from .denoise import step_local
from .modules import Modules
from .regions import region_weights


def regional_step_local(modules: Modules, params, *args, cfg: bool, prediction_type: str):
    """`denoise.step_local` with one more argument, last: the blend weights, a tuple of float32 [P, cells] per
    attention grid (the latents' first); every cross-attention of the UNet blends the prompt's P parts by them."""
    *step_args, weights = args
    with region_weights(weights):
        return step_local(modules, params, *step_args, cfg=cfg, prediction_type=prediction_type)
