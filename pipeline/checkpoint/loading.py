"""Loading: find the checkpoint, load it with diffusers' own loader, cast it, and say clearly what went wrong.

The loader has one path for every checkpoint (Hub id, local directory, or the tiny test model once built):
`FlaxStableDiffusionXLPipeline.from_pretrained(..., split_head_dim=True)`. Weights are cast to the requested dtype
on the host (no device compile per tensor); the scheduler state stays float32, because a bfloat16 scheduler
state accumulates error into low-quality or black images.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..config import SDXL_BASE, SDXL_BASE_FLAX_REVISION, TINY_MODEL
from ..errors import CheckpointError, ModelLoadError

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

    # Under the CI environment variable transformers also propagates to the root logger, past our filter: stop
    # that, so each record goes only through the libraries' own (filtered) handlers.
    diffusers_logging.disable_propagation()
    transformers_logging.disable_propagation()
    handlers = [
        *diffusers_logging.get_logger("diffusers").handlers,
        *transformers_logging.get_logger("transformers").handlers,
    ]
    for handler in handlers:  # records from the libraries' child loggers reach these handlers
        if not any(isinstance(f, _FlaxDeprecationFilter) for f in handler.filters):
            handler.addFilter(_FlaxDeprecationFilter())


@dataclass(frozen=True)
class LoadedModel:
    """A loaded pipeline: diffusers' module objects, the host parameters, and where they came from."""

    pipeline: Any  # FlaxStableDiffusionXLPipeline: modules (stateless) + tokenizers + scheduler
    params: dict  # {"text_encoder", "text_encoder_2", "unet", "vae": cast weights; "scheduler": float32 state}
    source: str  # the directory or Hub id it was loaded from
    load_s: float  # seconds to read the checkpoint
    cast_s: float  # seconds to cast the weights
    #: per weight component, where its weights came from: "flax", "converted" or "conversion cache"
    origins: dict = field(default_factory=dict)


def default_revision(model: str) -> str | None:
    """SDXL base keeps its Flax weights on a PR branch; other models use their default branch."""
    return SDXL_BASE_FLAX_REVISION if model == SDXL_BASE else None


def resolve_model(model: str, variant: str | None = None) -> str:
    """Map `model` to a local directory or a Hub id, rejecting what cannot be either."""
    if not isinstance(model, str) or not model.strip():
        raise CheckpointError("No model given: pass a Hub id, a local directory in diffusers' Flax layout, or 'tiny'.")
    model = model.strip()
    if model == TINY_MODEL:
        from .tiny import tiny_checkpoint

        return str(tiny_checkpoint())
    path = Path(model).expanduser()
    if path.is_dir():
        check_sdxl_directory(path, variant)
        return str(path)
    if path.exists():
        if path.suffix in (".safetensors", ".ckpt"):
            from .convert import check_single_file

            check_single_file(path)
        raise CheckpointError(
            f"Model path {model} is a file; pass the checkpoint directory (the one with model_index.json)."
        )
    if not _HUB_ID.match(model) or model.startswith((".", "/", "~")):
        raise CheckpointError(
            f"Model directory {model} does not exist; pass an existing directory, a Hub id like {SDXL_BASE}, or 'tiny'."
        )
    return model


def check_sdxl_directory(path: Path, variant: str | None = None) -> None:
    """Fail early, in one line, on a directory that is not an SDXL checkpoint with weights for every component.

    A component's weights are its Flax file, else its PyTorch safetensors: `variant`'s when it has them (e.g. only
    `*.fp16.safetensors`, as `huggingface-cli download --include "*.fp16.safetensors"` fetches), else the plain ones.
    A `variant` that no component needing PyTorch weights has is refused, not silently replaced by the plain files.
    """
    index_file = path / "model_index.json"
    if not index_file.is_file():
        raise CheckpointError(f"{path} has no model_index.json: it is not a checkpoint in diffusers' layout.")
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
    from .convert import pytorch_weight_files, weight_variants

    needs_pytorch = [name for name, file in FLAX_WEIGHTS.items() if not (path / name / file).is_file()]
    present = sorted({v for name in needs_pytorch for v in weight_variants(path / name, name)})
    if variant and needs_pytorch and variant not in present:  # bad input (CLI exit status 2), like unmappable files
        raise CheckpointError(
            f"{path} has no {variant!r} variant weights (*.{variant}.safetensors); "
            + (f"variants there: {', '.join(present)}." if present else "drop --variant: it has plain files only.")
        )
    no_weights = []
    for name in needs_pytorch:
        try:
            files = pytorch_weight_files(path / name, name, variant)
        except CheckpointError:  # e.g. the plain files' shard index without its shards
            if not present:
                raise
            files = None
        if files is None:
            no_weights.append(name)
    if no_weights:
        if present and not variant:
            raise CheckpointError(
                f"{path} has only {' / '.join(present)} variant weights for {', '.join(no_weights)}; "
                f"pass --variant {present[0]}."
            )
        only_bin = any((path / name).glob("*.bin") for name in no_weights)
        raise ModelLoadError(
            f"{path} has no Flax weights for {', '.join(no_weights)} and no PyTorch .safetensors either"
            + (" (only .bin files, which need torch: save them as safetensors)" if only_bin else "")
            + f"; for SDXL base download revision {SDXL_BASE_FLAX_REVISION} or its safetensors files."
        )


def has_flax_weights(path: Path) -> bool:
    """Every weight component of the checkpoint has Flax weights (then diffusers' own Flax loader is used)."""
    return all((path / name / file).is_file() for name, file in FLAX_WEIGHTS.items())


def cast_params(params: dict, dtype: str) -> dict:
    """Cast every weight to `dtype` on the host, leaving the scheduler state in float32."""
    import jax

    target = _NUMPY_DTYPES[dtype]

    def cast(leaf):
        array = np.asarray(leaf)
        # copy=False: converted weights are already in the target dtype; never hold two copies of the model.
        return array.astype(target, copy=False) if np.issubdtype(array.dtype, np.floating) else array

    cast_tree = {name: jax.tree_util.tree_map(cast, tree) for name, tree in params.items() if name != "scheduler"}
    cast_tree["scheduler"] = jax.tree_util.tree_map(lambda leaf: np.asarray(leaf, np.float32), params["scheduler"])
    return cast_tree


def load_model(
    model: str,
    *,
    dtype: str,
    revision: str | None = None,
    variant: str | None = None,
    unet: str | None = None,
    conversion_cache: bool = True,
) -> LoadedModel:
    """Load an SDXL checkpoint with `split_head_dim=True` and cast it; raise ModelLoadError with a clear message.

    Flax checkpoints go through diffusers' own loader. A checkpoint with PyTorch safetensors (or a `unet` file to
    swap in) is converted without torch by `convert.py`, component by component, Flax weights preferred.
    """
    quiet_diffusers_deprecation()
    import jax.numpy as jnp
    from diffusers import FlaxStableDiffusionXLPipeline

    source = resolve_model(model, variant)
    is_local = os.path.isdir(source)
    revision = None if is_local else (revision or default_revision(source))
    directory = source
    if not is_local:
        from .hub import source_when_offline

        # No network: the cached snapshot, or one line with the download command (not 25 s of retries).
        directory = source_when_offline(source, revision)
        if directory == source:
            try:
                directory = download_checkpoint(source, revision=revision, variant=variant)
            except ModelLoadError:
                raise
            except Exception as exc:  # huggingface_hub raises many types; turn each into one line
                raise ModelLoadError(_describe_load_failure(source, revision, False, exc)) from exc
        check_sdxl_directory(Path(directory), variant)
    if unet or not has_flax_weights(Path(directory)):
        return load_per_component(
            Path(directory), source=source, dtype=dtype, variant=variant, unet=unet, use_cache=conversion_cache
        )
    started = time.perf_counter()
    try:
        pipeline, params = FlaxStableDiffusionXLPipeline.from_pretrained(
            directory, split_head_dim=True, dtype=getattr(jnp, dtype)
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


# ---- PyTorch-format checkpoints, and a UNet file swapped in (conversion itself lives in convert.py) ----------------


def download_checkpoint(repo_id: str, *, revision: str | None, variant: str | None) -> str:
    """Hub id -> local snapshot with configs, tokenizers and ONE set of weights per component (Flax preferred).

    Offline (or no route to the Hub) whatever is in the local Hub cache is used; nothing cached raises
    huggingface_hub's LocalEntryNotFoundError, which load_model turns into its one-line "Could not download".
    """
    import fnmatch

    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    from .convert import weight_patterns

    metadata = ["model_index.json", "*/*.json", "*/*.txt"]
    try:
        files = HfApi().list_repo_files(repo_id, revision=revision)
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
        raise
    except Exception:  # offline mode, no network: use the local Hub cache only
        every = [f"{name}/{file}" for name, file in FLAX_WEIGHTS.items()]
        every += [p for name in FLAX_WEIGHTS for group in weight_patterns(name, variant) for p in group]
        return snapshot_download(repo_id, revision=revision, allow_patterns=metadata + every, local_files_only=True)
    patterns = list(metadata)
    pytorch_only = [name for name, flax_file in FLAX_WEIGHTS.items() if f"{name}/{flax_file}" not in files]
    if variant and pytorch_only and not any(
        fnmatch.fnmatch(file, pattern)
        for name in pytorch_only
        for pattern in weight_patterns(name, variant)[0]
        for file in files
    ):
        raise CheckpointError(f"Hub model {repo_id} has no {variant!r} variant weights (*.{variant}.safetensors).")
    for name, flax_file in FLAX_WEIGHTS.items():
        if f"{name}/{flax_file}" in files:
            patterns.append(f"{name}/{flax_file}")
            continue
        for group in weight_patterns(name, variant):
            if any(fnmatch.fnmatch(file, pattern) for file in files for pattern in group):
                patterns += group
                break
    return snapshot_download(repo_id, revision=revision, allow_patterns=patterns)


def resolve_unet_file(spec: str) -> Path:
    """`--unet`: a local .safetensors path, or REPO:FILE on the Hub (as SDXL-Lightning ships its UNets)."""
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"UNet file {spec} is not a .safetensors file; pass one holding a whole SDXL UNet.")
        return path
    repo_id, _, filename = spec.partition(":")
    if not filename or not _HUB_ID.match(repo_id) or not filename.endswith(".safetensors"):
        raise CheckpointError(
            f"UNet file {spec} does not exist; pass a local .safetensors file or REPO:FILE, e.g. "
            "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors."
        )
    from .hub import hub_file

    return Path(hub_file(repo_id, filename))  # offline: the cached copy, or one line with the download command


def load_per_component(
    directory: Path, *, source: str, dtype: str, variant: str | None, unet: str | None, use_cache: bool
) -> LoadedModel:
    """Build diffusers' Flax modules from the configs, then take each component's weights from its Flax file when
    there is one, else from its PyTorch safetensors (converted by convert.py, cached), and the UNet from `unet`."""
    from diffusers import FlaxStableDiffusionXLPipeline

    started = time.perf_counter()
    modules, tokenizers, scheduler = _modules_from_configs(directory, dtype)
    params: dict = {"scheduler": scheduler.create_state()}
    origins: dict = {}
    for name, module in modules.items():
        params[name], origins[name] = _component_weights(
            directory, name, module, dtype=dtype, variant=variant, unet=unet, use_cache=use_cache
        )
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    params = cast_params(params, dtype)
    cast_s = time.perf_counter() - started
    pipeline = FlaxStableDiffusionXLPipeline(
        text_encoder=modules["text_encoder"],
        text_encoder_2=modules["text_encoder_2"],
        vae=modules["vae"],
        tokenizer=tokenizers[0],
        tokenizer_2=tokenizers[1],
        unet=modules["unet"],
        scheduler=scheduler,
    )
    logger.info("loaded %s in %.1f s (%s)", source, load_s, ", ".join(f"{k}: {v}" for k, v in origins.items()))
    return LoadedModel(pipeline=pipeline, params=params, source=source, load_s=load_s, cast_s=cast_s, origins=origins)


def _modules_from_configs(directory: Path, dtype: str) -> tuple[dict, list, object]:
    """diffusers' and transformers' Flax modules (no weights), the tokenizers and the scheduler, from the configs."""
    import jax.numpy as jnp
    from diffusers import FlaxAutoencoderKL, FlaxEulerDiscreteScheduler, FlaxUNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTokenizer, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    jax_dtype = getattr(jnp, dtype)
    try:
        modules = {
            "unet": FlaxUNet2DConditionModel.from_config(
                _flax_config(FlaxUNet2DConditionModel, directory, "unet"), split_head_dim=True, dtype=jax_dtype
            ),
            "vae": FlaxAutoencoderKL.from_config(_flax_config(FlaxAutoencoderKL, directory, "vae"), dtype=jax_dtype),
            "text_encoder": FlaxCLIPTextModel(
                CLIPTextConfig.from_pretrained(directory / "text_encoder"), dtype=jax_dtype, _do_init=False
            ),
            "text_encoder_2": FlaxCLIPTextModelWithProjection(
                CLIPTextConfig.from_pretrained(directory / "text_encoder_2"), dtype=jax_dtype, _do_init=False
            ),
        }
        tokenizers = [CLIPTokenizer.from_pretrained(directory / name) for name in ("tokenizer", "tokenizer_2")]
        # The Flax scheduler from the config's fields it takes: a PyTorch config's others (karras sigmas, ...) would
        # each be warned about; samplers.py reads the file whole and refuses what the engine cannot honour.
        scheduler_config = _flax_config(FlaxEulerDiscreteScheduler, directory, "scheduler")
        scheduler = FlaxEulerDiscreteScheduler.from_config(scheduler_config)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        detail = " ".join(str(exc).split())[:200] or exc.__class__.__name__
        raise CheckpointError(f"Could not read the configs or tokenizers in {directory}: {detail}") from None
    return modules, tokenizers, scheduler


def _component_weights(
    directory: Path, name: str, module, *, dtype: str, variant: str | None, unet: str | None, use_cache: bool
) -> tuple[dict, str]:
    """One component's weights and where they came from: its Flax file, else its PyTorch safetensors (or the UNet
    file `unet`) converted without torch, cached."""
    from flax.serialization import msgpack_restore

    from .convert import load_converted, pytorch_weight_files

    flax_file = directory / name / FLAX_WEIGHTS[name]
    if name == "unet" and unet:
        files = [resolve_unet_file(unet)]
    elif flax_file.is_file():
        return msgpack_restore(flax_file.read_bytes()), "flax"
    else:
        files = pytorch_weight_files(directory / name, name, variant)
        if files is None:
            raise CheckpointError(f"{directory / name} has neither Flax nor PyTorch safetensors weights.")
    if name.startswith("text_encoder"):
        init, prefix, config = (
            functools.partial(module.init_weights, input_shape=module.input_shape),
            module.base_model_prefix,
            module.config.to_dict(),
        )
    else:
        init, prefix, config = module.init_weights, None, dict(module.config)
    converted = load_converted(
        files, init, component=name, dtype=dtype, config=config, model_prefix=prefix, use_cache=use_cache
    )
    return converted.params, "conversion cache" if converted.cached else "converted"


def _flax_config(cls, directory: Path, subfolder: str) -> dict:
    """A PyTorch model config without the fields the Flax class has no argument for (diffusers warns about each)."""
    import inspect

    config = cls.load_config(directory, subfolder=subfolder)
    accepted = inspect.signature(cls).parameters
    return {key: value for key, value in config.items() if key in accepted or key.startswith("_")}
