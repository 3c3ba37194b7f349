"""Loading: find the checkpoint, load it with diffusers' own loader, cast it, and say clearly what went wrong.

The loader has one path for every checkpoint (Hub id, local directory, or the tiny test model once built):
`FlaxStableDiffusionXLPipeline.from_pretrained(..., split_head_dim=True)`. Weights are cast to the requested dtype
on the host (no device compile per tensor); the scheduler state stays float32, because a bfloat16 scheduler
state accumulates error into low-quality or black images.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .settings import SDXL_BASE, SDXL_BASE_FLAX_REVISION, TINY_MODEL

logger = logging.getLogger(__name__)

#: Components an SDXL checkpoint in diffusers' layout has (model_index.json keys).
SDXL_COMPONENTS = ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "vae", "scheduler")
#: Flax weight files diffusers (models) and transformers (text encoders) write.
FLAX_WEIGHTS = {
    "unet": "diffusion_flax_model.msgpack",
    "vae": "diffusion_flax_model.msgpack",
    "text_encoder": "flax_model.msgpack",
    "text_encoder_2": "flax_model.msgpack",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


class _FlaxDeprecationFilter(logging.Filter):
    """Drop diffusers' and transformers' "... classes are deprecated" notices: the pins are deliberate."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "classes are deprecated and will be removed" not in record.getMessage()


def quiet_diffusers_deprecation() -> None:
    """diffusers 0.39 / transformers 4.57 are the last releases with Flax; requirements.txt says why they are pinned."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    handlers = [
        *diffusers_logging.get_logger("diffusers").handlers,
        *transformers_logging.get_logger("transformers").handlers,
    ]
    for handler in handlers:  # records from the libraries' child loggers reach these handlers
        if not any(isinstance(f, _FlaxDeprecationFilter) for f in handler.filters):
            handler.addFilter(_FlaxDeprecationFilter())


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message names the problem and what to do, in one line."""


@dataclass(frozen=True)
class LoadedModel:
    """A loaded pipeline: diffusers' module objects, the host parameters, and where they came from."""

    pipeline: Any  # FlaxStableDiffusionXLPipeline: modules (stateless) + tokenizers + scheduler
    params: dict  # {"text_encoder", "text_encoder_2", "unet", "vae": cast weights; "scheduler": float32 state}
    source: str  # the directory or Hub id it was loaded from
    load_s: float  # seconds to read the checkpoint
    cast_s: float  # seconds to cast the weights


def default_revision(model: str) -> str | None:
    """SDXL base keeps its Flax weights on a PR branch; other models use their default branch."""
    return SDXL_BASE_FLAX_REVISION if model == SDXL_BASE else None


def resolve_model(model: str) -> str:
    """Map `model` to a local directory or a Hub id, rejecting what cannot be either."""
    if not isinstance(model, str) or not model.strip():
        raise ModelLoadError("No model given: pass a Hub id, a local directory in diffusers' Flax layout, or 'tiny'.")
    model = model.strip()
    if model == TINY_MODEL:
        from .tiny import tiny_checkpoint

        return str(tiny_checkpoint())
    path = Path(model).expanduser()
    if path.is_dir():
        check_sdxl_directory(path)
        return str(path)
    if path.exists():
        raise ModelLoadError(
            f"Model path {model} is a file; pass the checkpoint directory (the one with model_index.json)."
        )
    if not _HUB_ID.match(model) or model.startswith((".", "/", "~")):
        raise ModelLoadError(
            f"Model directory {model} does not exist; pass an existing directory, a Hub id like {SDXL_BASE}, or 'tiny'."
        )
    return model


def check_sdxl_directory(path: Path) -> None:
    """Fail early, in one line, on a directory that is not an SDXL checkpoint with Flax weights."""
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise ModelLoadError(f"{path} has no model_index.json: it is not a checkpoint in diffusers' layout.")
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{index_file} is not readable JSON ({exc.__class__.__name__}).") from None
    class_name = str(index.get("_class_name", ""))
    missing = [name for name in SDXL_COMPONENTS if name not in index]
    if "StableDiffusionXL" not in class_name or missing:
        raise ModelLoadError(
            f"{path} is not an SDXL checkpoint (model_index.json names {class_name or 'no pipeline'}"
            + (f" and lacks {', '.join(missing)}" if missing else "")
            + "); pass SDXL base or a checkpoint saved by FlaxStableDiffusionXLPipeline.save_pretrained."
        )
    no_flax = [name for name, file in FLAX_WEIGHTS.items() if not (path / name / file).is_file()]
    if no_flax:
        raise ModelLoadError(
            f"{path} has no Flax weights for {', '.join(no_flax)}; for SDXL base download revision "
            f"{SDXL_BASE_FLAX_REVISION}, or convert a PyTorch checkpoint with "
            "FlaxStableDiffusionXLPipeline.save_pretrained."
        )


def cast_params(params: dict, dtype: str) -> dict:
    """Cast every weight to `dtype` on the host, leaving the scheduler state in float32."""
    import jax

    target = _NUMPY_DTYPES[dtype]

    def cast(leaf):
        array = np.asarray(leaf)
        return array.astype(target) if np.issubdtype(array.dtype, np.floating) else array

    cast_tree = {name: jax.tree_util.tree_map(cast, tree) for name, tree in params.items() if name != "scheduler"}
    cast_tree["scheduler"] = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float32), params["scheduler"])
    return cast_tree


def load_model(model: str, *, dtype: str, revision: str | None = None) -> LoadedModel:
    """Load an SDXL checkpoint with `split_head_dim=True` and cast it; raise ModelLoadError with a clear message."""
    quiet_diffusers_deprecation()
    import jax.numpy as jnp
    from diffusers import FlaxStableDiffusionXLPipeline

    source = resolve_model(model)
    is_local = os.path.isdir(source)
    revision = None if is_local else (revision or default_revision(source))
    if not is_local:  # no network: the cached copy, or one line with the download command (not 25 s of retries)
        from .hub import source_when_offline

        source = source_when_offline(source, revision)
    started = time.perf_counter()
    try:
        pipeline, params = FlaxStableDiffusionXLPipeline.from_pretrained(
            source, revision=revision, split_head_dim=True, dtype=getattr(jnp, dtype)
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # diffusers/huggingface_hub raise many types; turn each into one line
        raise ModelLoadError(_describe_load_failure(source, revision, is_local, exc)) from exc
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    params = cast_params(params, dtype)
    cast_s = time.perf_counter() - started
    logger.info("loaded %s in %.1f s, cast to %s in %.1f s", source, load_s, dtype, cast_s)
    return LoadedModel(pipeline=pipeline, params=params, source=source, load_s=load_s, cast_s=cast_s)


def _describe_load_failure(source: str, revision: str | None, is_local: bool, exc: Exception) -> str:
    detail = " ".join(str(exc).split())[:200] or exc.__class__.__name__
    if is_local:
        return f"Could not load the checkpoint in {source}: {detail}"
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    from .hub import download_command

    where = f"{source}" + (f" (revision {revision})" if revision else "")
    if isinstance(exc, RepositoryNotFoundError):
        return f"Hub model {where} was not found (or needs a token: set HF_TOKEN); check the id."
    if isinstance(exc, RevisionNotFoundError):
        return f"Hub model {source} has no revision {revision}; pass --revision with an existing branch or commit."
    if isinstance(exc, (LocalEntryNotFoundError, ConnectionError, OSError)):
        return (
            f"Could not download {where} from the Hugging Face Hub (no network, or not in the local cache); "
            f"where there is network run `{download_command(source, revision)}`, or pass a local directory or 'tiny'."
        )
    return f"Could not load {where}: {detail}"
