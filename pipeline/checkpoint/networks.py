"""The networks of one SDXL checkpoint, built from its config.json files with the project's own modules.

The modules (`device/nets/`) are stateless: the weights travel apart as the loader's `params`. Their parameter trees
are those of diffusers' and transformers' Flax classes, so the checkpoint's files (Flax msgpack or converted PyTorch
safetensors) fit them as they are. The tokenizers are CLIP's BPE (`clip_tokenizer.py`, the project's own, pure
Python); the scheduler is its config only: the engine's samplers compute their own schedules from it
(`host/planning/sampler_plan.py`).

Imported inside `build_networks`: jax and the networks (`..device.nets`; heavy: `loading.py` imports this module
before the CPU device count is set and JAX starts), and the `clip_tokenizer` (heavy: its regex, 35 ms).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..contract.errors import CheckpointError

#: Flax weight files diffusers (models) and transformers (text encoders) write, per weight component.
FLAX_WEIGHTS = {
    "unet": "diffusion_flax_model.msgpack",
    "vae": "diffusion_flax_model.msgpack",
    "text_encoder": "flax_model.msgpack",
    "text_encoder_2": "flax_model.msgpack",
}


@dataclasses.dataclass(frozen=True)
class Networks:
    """One checkpoint's modules (no weights), tokenizers and scheduler config."""

    unet: Any  # device/nets/unet.UNet2DConditionModel
    vae: Any  # device/nets/vae.AutoencoderKL
    text_encoder: Any  # device/nets/clip.CLIPTextModel
    text_encoder_2: Any  # device/nets/clip.CLIPTextModelWithProjection
    tokenizer: Any  # checkpoint/clip_tokenizer.ClipTokenizer
    tokenizer_2: Any  # checkpoint/clip_tokenizer.ClipTokenizer
    scheduler_config: dict  # scheduler/scheduler_config.json, whole

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent: 8 for SDXL's VAE (one halving per block but the last)."""
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def unet_config(self) -> dict:
        """The UNet's shaping config fields by their config.json names (LoRA key maps, ControlNet fit)."""
        return dataclasses.asdict(self.unet.config)


def read_config(directory: Path, name: str) -> dict:
    """`directory/name`'s config.json (scheduler: scheduler_config.json) as a dict."""
    file = directory / name / ("scheduler_config.json" if name == "scheduler" else "config.json")
    config = json.loads(file.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{file.name} of {name} is not a JSON object")
    return config


def build_networks(directory: Path, dtype: str) -> Networks:
    """The modules computing in `dtype` for the configs in `directory` (diffusers' layout); CheckpointError in one
    line when a config or tokenizer is missing or describes something that is not SDXL's."""
    import jax.numpy as jnp

    from ..device.nets.clip import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    from ..device.nets.unet import UNet2DConditionModel, UNetConfig
    from ..device.nets.vae import AutoencoderKL, VAEConfig
    from .clip_tokenizer import ClipTokenizer

    jax_dtype = getattr(jnp, dtype)
    try:
        text_config = CLIPTextConfig.from_dict(read_config(directory, "text_encoder"))
        text_2_config = CLIPTextConfig.from_dict(read_config(directory, "text_encoder_2"))
        return Networks(
            unet=UNet2DConditionModel(UNetConfig.from_dict(read_config(directory, "unet")), dtype=jax_dtype),
            vae=AutoencoderKL(VAEConfig.from_dict(read_config(directory, "vae")), dtype=jax_dtype),
            text_encoder=CLIPTextModel(text_config, dtype=jax_dtype),
            text_encoder_2=CLIPTextModelWithProjection(text_2_config, dtype=jax_dtype),
            tokenizer=ClipTokenizer.from_directory(directory / "tokenizer"),
            tokenizer_2=ClipTokenizer.from_directory(directory / "tokenizer_2"),
            scheduler_config=read_config(directory, "scheduler"),
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:200] or exc.__class__.__name__
        raise CheckpointError(f"Could not read the configs or tokenizers in {directory}: {detail}") from None
