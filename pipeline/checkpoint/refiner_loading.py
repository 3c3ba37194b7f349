"""SDXL's refiner (`--refiner PATH_OR_REPO`): its UNet and its text encoder 2, in diffusers' layout, no torch.

`stabilityai/stable-diffusion-xl-refiner-1.0` is a `StableDiffusionXLImg2ImgPipeline` checkpoint with no text
encoder 1: its UNet reads CLIP-G's penultimate hidden states (1280 wide) and pooled projection, and 5 time ids (the
aesthetic score after the crop; `nets/unet.UNetConfig.time_ids`). Its CLIP-G weights are the base's: when the file
the loader would read is byte for byte the base's, the base's weights are used (placed once, logged); otherwise the
refiner's own are read. Each component comes from its Flax file when there is one, else its PyTorch safetensors
(the asked variant, else the plain files, else the one variant present), converted without torch as the base's are.
The tokenizer must be the base's tokenizer 2 (the same token ids feed both encoders); anything else is refused in
one sentence naming the folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from ..contract.errors import CheckpointError
from ..contract.request import refiner_name
from ..device.nets.clip import CLIPTextConfig, CLIPTextModelWithProjection
from ..device.nets.unet import UNet2DConditionModel, UNetConfig
from . import convert
from .clip_tokenizer import ClipTokenizer
from .hub import folder_or_snapshot
from .loading import _flax_weights, cast_params
from .networks import FLAX_WEIGHTS, read_config

logger = logging.getLogger(__name__)

#: What the refiner's folder must hold (model_index.json keys with a component).
REFINER_COMPONENTS = ("unet", "text_encoder_2", "tokenizer_2")
#: What a Hub download fetches: configs, tokenizer 2 and the two weight components (either format).
REFINER_PATTERNS = ("model_index.json", "unet/*", "text_encoder_2/*", "tokenizer_2/*", "scheduler/*")


@dataclass(frozen=True)
class RefinerWeights:
    """A loaded refiner: its name (as `parameters` writes it), modules, weights and whether CLIP-G is the base's."""

    name: str  # the folder's or repo's name ("Refiner: <name>" in the parameters)
    unet: Any  # nets/unet.UNet2DConditionModel with 5 time ids
    text_encoder_2: Any  # nets/clip.CLIPTextModelWithProjection
    params: dict  # {"unet": ..., "text_encoder_2": ...} (the latter absent when shared), cast to the engine's dtype
    shared_text_encoder: bool  # True: the base's text encoder 2 weights serve both stages
    zero_empty_negative: bool  # model_index.json's force_zeros_for_empty_prompt (the refiner's: False)
    source: str  # the path or Hub id given (logged at start-up only, never shown to users)
    seconds: float  # time to read (and convert) its weights


def weight_files(directory: Path, name: str, variant: str | None) -> list[Path]:
    """The file(s) a component's weights are read from: its Flax file, else its PyTorch safetensors (`variant`'s,
    else the plain ones, else the one variant present)."""
    flax_file = directory / name / FLAX_WEIGHTS[name]
    if flax_file.is_file():
        return [flax_file]
    files = convert.pytorch_weight_files(directory / name, name, variant)
    if files is None:
        variants = convert.weight_variants(directory / name, name)
        if len(variants) == 1:
            files = convert.pytorch_weight_files(directory / name, name, variants[0])
    if files is None:
        raise CheckpointError(f"its {name} has neither Flax nor PyTorch safetensors weights")
    return files


def same_files(ours: list[Path], theirs: list[Path]) -> bool:
    """The two lists name byte-identical files (sizes first: only files of equal size are hashed)."""
    if [p.stat().st_size for p in ours] != [p.stat().st_size for p in theirs]:
        return False
    return [_sha256(p) for p in ours] == [_sha256(p) for p in theirs]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _component(directory: Path, name: str, module, files: list[Path], dtype: str, use_cache: bool) -> dict:
    if files[0].suffix == ".msgpack":
        return _flax_weights(files[0], module)
    prefix = "" if name.startswith("text_encoder") else None  # transformers' empty base-model prefix
    return convert.load_converted(
        files,
        module.init_weights,
        component=name,
        dtype=dtype,
        config=dataclasses.asdict(module.config),
        model_prefix=prefix,
        use_cache=use_cache,
    ).params


def refiner_modules(directory: Path, dtype: str, base_networks):
    """The refiner's UNet and CLIP-G modules from its configs, checked to be a refiner for this base."""
    try:
        unet_config = UNetConfig.from_dict(read_config(directory, "unet"))
        text_config = CLIPTextConfig.from_dict(read_config(directory, "text_encoder_2"))
        tokenizer = ClipTokenizer.from_directory(directory / "tokenizer_2")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:160] or exc.__class__.__name__
        raise CheckpointError(f"its configs or tokenizer cannot be read ({detail})") from None
    if unet_config.time_ids != 5:
        raise CheckpointError("its UNet takes 6 time ids, not the refiner's 5 (a base checkpoint?)")
    if unet_config.cross_attention_dim != text_config.hidden_size:
        raise CheckpointError(
            f"its UNet reads {unet_config.cross_attention_dim}-wide text, its text encoder 2 "
            f"gives {text_config.hidden_size}"
        )
    if text_config.hidden_size != base_networks.text_encoder_2.config.hidden_size:
        raise CheckpointError(
            f"its text encoder 2 is {text_config.hidden_size} wide, the base's "
            f"{base_networks.text_encoder_2.config.hidden_size}"
        )
    if unet_config.in_channels != 4 or unet_config.out_channels != 4:
        raise CheckpointError(f"its UNet reads {unet_config.in_channels} channels, not SDXL's 4 latent channels")
    base_tokenizer = base_networks.tokenizer_2
    if (tokenizer.vocab, tokenizer.ranks, tokenizer.pad_token_id) != (
        base_tokenizer.vocab,
        base_tokenizer.ranks,
        base_tokenizer.pad_token_id,
    ):
        raise CheckpointError("its tokenizer 2 is not the base's")
    jax_dtype = getattr(jnp, dtype)
    return UNet2DConditionModel(unet_config, dtype=jax_dtype), CLIPTextModelWithProjection(text_config, dtype=jax_dtype)


def load_refiner(
    source: str, base, *, dtype: str, variant: str | None = None, use_cache: bool = True
) -> RefinerWeights:
    """`--refiner` -> RefinerWeights for the loaded base `base` (`loading.LoadedModel`); CheckpointError in one
    sentence naming it when it cannot be (the server then does not start: the user asked for it)."""
    started = time.perf_counter()
    try:
        directory = folder_or_snapshot(source, REFINER_PATTERNS, "model_index.json, unet/, text_encoder_2/")
        try:
            index = json.loads((directory / "model_index.json").read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"its model_index.json cannot be read ({exc.__class__.__name__})") from None
        missing = [name for name in REFINER_COMPONENTS if not (index.get(name) or [None])[0]]
        if missing:
            raise CheckpointError(f"its model_index.json has no {', '.join(missing)}")
        unet_module, text_module = refiner_modules(directory, dtype, base.networks)
        params = {
            "unet": _component(
                directory, "unet", unet_module, weight_files(directory, "unet", variant), dtype, use_cache
            )
        }
        ours = weight_files(directory, "text_encoder_2", variant)
        shared = bool(base.directory) and same_files(
            ours, weight_files(Path(base.directory), "text_encoder_2", variant)
        )
        if shared and dataclasses.asdict(text_module.config) != dataclasses.asdict(base.networks.text_encoder_2.config):
            shared = False  # the same weights under another config: not the same network
        if not shared:
            params["text_encoder_2"] = _component(directory, "text_encoder_2", text_module, ours, dtype, use_cache)
    except CheckpointError as exc:
        raise CheckpointError(f"Refiner {source} was not loaded: {str(exc).rstrip('.')}.") from None
    params = cast_params(params, dtype)
    seconds = time.perf_counter() - started
    logger.info(
        "refiner %s: UNet loaded in %.1f s; text encoder 2 %s",
        refiner_name(source),
        seconds,
        "shared with the base (the same weights file)" if shared else "its own (its weights file is not the base's)",
    )
    return RefinerWeights(
        name=refiner_name(source),
        unet=unet_module,
        text_encoder_2=text_module,
        params=params,
        shared_text_encoder=shared,
        zero_empty_negative=bool(index.get("force_zeros_for_empty_prompt", False)),
        source=source,
        seconds=seconds,
    )
