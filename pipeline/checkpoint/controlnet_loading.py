"""SDXL ControlNets in diffusers' layout (`config.json` + safetensors, fp16 variants) -> Flax parameters, no torch.

`diffusers/controlnet-*-sdxl-1.0(-mid|-small)`, `xinsir/controlnet-*-sdxl-1.0` and `thibaud/controlnet-openpose-
sdxl-1.0` ship this layout, and so does xinsir's `controlnet-union-sdxl-1.0` (ProMax), told by its config
(`ControlNetUnionModel`, `num_control_type`). The config builds `device/nets/controlnet.SDXLControlNet` (or
`controlnet_union.SDXLControlNetUnion`); `convert.load_converted` reads each tensor with diffusers' own PyTorch ->
Flax renames and checks it against the module's traced shapes, so every weight is accounted for: a tensor with no
place, or a parameter no tensor fills, is an error naming it. A ControlNet for another model (SD 1.5: no `text_time`
add-embedding, 768-wide text) is refused in one sentence.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from ..contract.errors import CheckpointError
from ..device.nets.controlnet import SDXLControlNet
from ..device.nets.controlnet_union import SDXLControlNetUnion
from . import convert
from .hub import folder_or_snapshot

logger = logging.getLogger(__name__)
#: What a ControlNet from the Hub is downloaded with: its config and its weights of either precision.
CONTROLNET_PATTERNS = ("config.json", "*.safetensors")

WEIGHT_STEM = "diffusion_pytorch_model"
#: Config entries whose value must be the one SDXL's ControlNets have (anything else has no Flax counterpart here).
_REQUIRED = {
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "class_embed_type": None,
    "encoder_hid_dim": None,
    "encoder_hid_dim_type": None,
    "num_attention_heads": None,
    "only_cross_attention": False,
    "upcast_attention": False,
    "resnet_time_scale_shift": "default",
    "global_pool_conditions": False,
    "norm_num_groups": 32,
    "act_fn": "silu",
    "downsample_padding": 1,
    "mid_block_scale_factor": 1,
}
_EMBEDDING = (16, 32, 96, 256)  # diffusers' default conditioning embedding channels
_BLOCK_TYPES = {"DownBlock2D", "CrossAttnDownBlock2D"}


@dataclass(frozen=True)
class ControlNetWeights:
    """One loaded ControlNet: its name (as requests and `parameters` say it), module, weights and source."""

    name: str
    module: Any  # device.controlnet.SDXLControlNet
    params: dict  # nested NumPy arrays in the engine's dtype
    source: str  # the path or Hub id it came from (logged at start-up only, never shown to users)
    bytes: int  # size of the converted weights
    seconds: float  # time to convert or read from the conversion cache
    cached: bool  # read from the conversion cache

    @property
    def parameter_count(self) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in flatten_dict(self.params).values())


def split_spec(spec: str) -> tuple[str, str]:
    """`NAME=PATH_OR_REPO` or `PATH_OR_REPO` -> (name, source); the name defaults to the folder's (repo's) name."""
    name, sep, source = spec.partition("=")
    if not sep:
        name, source = "", spec
    source = source.strip()
    name = name.strip() or Path(source.rstrip("/")).name
    if not source or not name:
        raise CheckpointError(f"--controlnet {spec!r} names no folder or Hub id; pass PATH, REPO or NAME=PATH.")
    return name, source


def controlnet_module(config: dict, dtype: str):
    """`SDXLControlNet` for a diffusers ControlNet config; CheckpointError when it is no SDXL ControlNet."""
    if config.get("addition_embed_type") != "text_time":
        raise CheckpointError(
            f"it is not an SDXL ControlNet (addition_embed_type {config.get('addition_embed_type')!r}, "
            f"text width {config.get('cross_attention_dim')}: an SD 1.5/2.x ControlNet?)"
        )
    for key, wanted in _REQUIRED.items():
        if config.get(key, wanted) != wanted and not (config.get(key) is None and wanted is False):  # null = off
            raise CheckpointError(f"its config has {key}={config[key]!r}, which this engine does not run")
    if not set(config.get("down_block_types", ())) <= _BLOCK_TYPES:
        raise CheckpointError(f"its down blocks {config['down_block_types']} are not SDXL's")
    if config.get("norm_eps", 1e-5) != 1e-5:
        raise CheckpointError(f"its norm_eps {config['norm_eps']} is not SDXL's 1e-5")
    order = config.get("controlnet_conditioning_channel_order", "rgb")
    if is_union(config) and order != "rgb":
        raise CheckpointError(f"it is a union ControlNet with channel order {order!r} (diffusers runs rgb only)")
    cls, extra = (SDXLControlNetUnion, _union_fields(config)) if is_union(config) else (SDXLControlNet, {})
    return cls(
        in_channels=config.get("in_channels", 4),
        conditioning_channels=config.get("conditioning_channels", 3),
        down_block_types=tuple(config["down_block_types"]),
        block_out_channels=tuple(config["block_out_channels"]),
        layers_per_block=config.get("layers_per_block", 2),
        attention_head_dim=_tuple(config.get("attention_head_dim", 8)),
        cross_attention_dim=config["cross_attention_dim"],
        transformer_layers_per_block=_tuple(config.get("transformer_layers_per_block", 1)),
        use_linear_projection=config.get("use_linear_projection", False),
        addition_time_embed_dim=config["addition_time_embed_dim"],
        projection_class_embeddings_input_dim=config["projection_class_embeddings_input_dim"],
        flip_sin_to_cos=config.get("flip_sin_to_cos", True),
        freq_shift=config.get("freq_shift", 0),
        conditioning_embedding_out_channels=tuple(config.get("conditioning_embedding_out_channels") or _EMBEDDING),
        bgr=order == "bgr",
        dtype=getattr(jnp, dtype),
        **extra,
    )


def is_union(config: dict) -> bool:
    """A ControlNet Union (xinsir's ProMax): diffusers names its class, xinsir's config has `num_control_type`."""
    return config.get("_class_name") == "ControlNetUnionModel" or "num_control_type" in config


def _union_fields(config: dict) -> dict:
    """The union parts' sizes (diffusers' `ControlNetUnionModel` defaults where the config leaves one out)."""
    defaults = {
        "num_control_type": 6,
        "num_trans_channel": 320,
        "num_trans_head": 8,
        "num_trans_layer": 1,
        "num_proj_channel": 320,
    }
    return {key: config.get(key, value) for key, value in defaults.items()}


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def weight_files(directory: Path, variant: str | None) -> list[Path]:
    """The safetensors to read: the asked variant, else the plain file, else the one variant present (fp16)."""
    files = convert.pytorch_weight_files(directory, "unet", variant)
    if files is None:
        variants = convert.weight_variants(directory, "unet")
        if len(variants) == 1:
            files = convert.pytorch_weight_files(directory, "unet", variants[0])
    if files is None:
        raise CheckpointError(f"it has no {WEIGHT_STEM}[.fp16].safetensors (only safetensors are read)")
    return files


def load_controlnet(spec: str, dtype: str, *, variant: str | None = None, use_cache: bool = True) -> ControlNetWeights:
    """One `--controlnet` value -> ControlNetWeights; CheckpointError (one sentence naming it) when it cannot be."""
    name, source = split_spec(spec)
    try:
        directory = folder_or_snapshot(source, CONTROLNET_PATTERNS, "config.json + safetensors")
        try:
            config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"its config.json cannot be read ({exc.__class__.__name__})") from None
        module = controlnet_module(config, dtype)
        files = weight_files(directory, variant)
        converted = convert.load_converted(
            files, module.init_weights, component="controlnet", dtype=dtype, config=config, use_cache=use_cache
        )
    except CheckpointError as exc:
        raise CheckpointError(f"ControlNet {name!r} was not loaded: {str(exc).rstrip('.')}.") from None
    size = sum(leaf.nbytes for leaf in _leaves(converted.params))
    return ControlNetWeights(name, module, converted.params, source, size, converted.seconds, converted.cached)


def _leaves(tree):
    return flatten_dict(tree).values()


def load_controlnets(specs, dtype: str, *, variant: str | None = None, use_cache: bool = True) -> list:
    """Every `--controlnet` that loads, in order; each that does not is logged in one line and left out."""
    loaded, names = [], set()
    for spec in specs:
        try:
            weights = load_controlnet(spec, dtype, variant=variant, use_cache=use_cache)
        except CheckpointError as exc:
            logger.error("%s The server starts without it.", exc)
            continue
        if weights.name in names:
            logger.error("ControlNet %r is given twice; the second is left out.", weights.name)
            continue
        names.add(weights.name)
        logger.info(
            "ControlNet %r: %.0f M parameters, %.1f MiB (%s, %.1f s)",
            weights.name,
            weights.parameter_count / 1e6,
            weights.bytes / 2**20,
            "conversion cache" if weights.cached else "converted",
            weights.seconds,
        )
        loaded.append(weights)
    return loaded
