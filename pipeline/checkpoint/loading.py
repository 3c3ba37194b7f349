"""Loading: find the checkpoint, build its networks, read its weights, cast them, and say clearly what went wrong.

The loader has one path for every checkpoint (Hub id, local directory, or the tiny test model once built): the
project's own modules from the config.json files (`networks.py`), then each component's weights from its Flax
msgpack file (`flax.serialization.msgpack_restore`, as diffusers and transformers read them), else from its PyTorch
safetensors converted without torch (`convert.py`). Weights are cast to the requested dtype on the host (no device
compile per tensor).

Imported inside functions: jax and flax (heavy: `startup.check` calls `resolve_model` before the CPU device count is
set and JAX starts), huggingface_hub and `.hub` (heavy: 0.3 s, for a Hub id only).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np

from ..config import SDXL_BASE, SDXL_BASE_FLAX_REVISION, TINY_MODEL
from ..contract.errors import CheckpointError, ModelLoadError
from .convert import check_single_file, load_converted, pytorch_weight_files, weight_patterns, weight_variants
from .networks import FLAX_WEIGHTS, Networks, build_networks
from .tiny import tiny_checkpoint

logger = logging.getLogger(__name__)

#: Components an SDXL checkpoint in diffusers' layout has (model_index.json keys).
SDXL_COMPONENTS = ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "unet", "vae", "scheduler")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


@dataclass(frozen=True)
class LoadedModel:
    """A loaded checkpoint: its networks (stateless modules, tokenizers, scheduler config), the host parameters,
    and where they came from."""

    networks: Networks
    params: dict  # {"text_encoder", "text_encoder_2", "unet", "vae"}: the weights, cast
    source: str  # the directory or Hub id it was loaded from
    load_s: float  # seconds to read the checkpoint
    cast_s: float  # seconds to cast the weights
    #: per weight component, where its weights came from: "flax", "converted" or "conversion cache"
    origins: dict = field(default_factory=dict)
    directory: str = ""  # the local folder its files were read from (a Hub id's snapshot): what a refiner shares


def default_revision(model: str) -> str | None:
    """SDXL base keeps its Flax weights on a PR branch; other models use their default branch."""
    return SDXL_BASE_FLAX_REVISION if model == SDXL_BASE else None


def resolve_model(model: str, variant: str | None = None) -> str:
    """Map `model` to a local directory or a Hub id, rejecting what cannot be either."""
    if not isinstance(model, str) or not model.strip():
        raise CheckpointError("No model given: pass a Hub id, a local directory in diffusers' Flax layout, or 'tiny'.")
    model = model.strip()
    if model == TINY_MODEL:
        return str(tiny_checkpoint())
    path = Path(model).expanduser()
    if path.is_dir():
        check_sdxl_directory(path, variant)
        return str(path)
    if path.exists():
        if path.suffix in (".safetensors", ".ckpt"):
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
    `*.fp16.safetensors`, as `hf download --include "*.fp16.safetensors"` fetches), else the plain ones.
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
            + "); pass SDXL base or another SDXL checkpoint in diffusers' layout."
        )
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
    """Every weight component of the checkpoint has Flax weights (then nothing is converted)."""
    return all((path / name / file).is_file() for name, file in FLAX_WEIGHTS.items())


def cast_params(params: dict, dtype: str) -> dict:
    """Cast every weight to `dtype` on the host."""
    import jax

    target = _NUMPY_DTYPES[dtype]

    def cast(leaf):
        array = np.asarray(leaf)
        # copy=False: converted weights are already in the target dtype; never hold two copies of the model.
        return array.astype(target, copy=False) if np.issubdtype(array.dtype, np.floating) else array

    return {name: jax.tree_util.tree_map(cast, tree) for name, tree in params.items()}


def load_model(
    model: str,
    *,
    dtype: str,
    revision: str | None = None,
    variant: str | None = None,
    unet: str | None = None,
    conversion_cache: bool = True,
) -> LoadedModel:
    """Load an SDXL checkpoint and cast it; raise ModelLoadError with a clear message.

    Each component's weights come from its Flax file when it has one, else from its PyTorch safetensors (or the
    `unet` file swapped in), converted without torch by `convert.py`.
    """
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
    load = functools.partial(
        load_per_component,
        Path(directory),
        source=source,
        dtype=dtype,
        variant=variant,
        unet=unet,
        use_cache=conversion_cache,
    )
    if unet or not has_flax_weights(Path(directory)):
        return load()
    try:
        return load()
    except ModelLoadError:
        raise
    except Exception as exc:  # a damaged msgpack or tokenizer file raises many types; turn each into one line
        raise ModelLoadError(_describe_load_failure(source, revision, is_local, exc)) from exc


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
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

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
    if (
        variant
        and pytorch_only
        and not any(
            fnmatch.fnmatch(file, pattern)
            for name in pytorch_only
            for pattern in weight_patterns(name, variant)[0]
            for file in files
        )
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
    """Build the networks from the configs, then take each component's weights from its Flax file when there is
    one, else from its PyTorch safetensors (converted by convert.py, cached), and the UNet from `unet`."""
    started = time.perf_counter()
    networks = build_networks(directory, dtype)
    params: dict = {}
    origins: dict = {}
    for name in FLAX_WEIGHTS:
        params[name], origins[name] = _component_weights(
            directory, name, getattr(networks, name), dtype=dtype, variant=variant, unet=unet, use_cache=use_cache
        )
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    params = cast_params(params, dtype)
    cast_s = time.perf_counter() - started
    logger.info(
        "loaded %s in %.1f s (%s), cast to %s in %.1f s",
        source,
        load_s,
        ", ".join(f"{k}: {v}" for k, v in origins.items()),
        dtype,
        cast_s,
    )
    return LoadedModel(
        networks=networks,
        params=params,
        source=source,
        load_s=load_s,
        cast_s=cast_s,
        origins=origins,
        directory=str(directory),
    )


def _component_weights(
    directory: Path, name: str, module, *, dtype: str, variant: str | None, unet: str | None, use_cache: bool
) -> tuple[dict, str]:
    """One component's weights and where they came from: its Flax file, else its PyTorch safetensors (or the UNet
    file `unet`) converted without torch, cached."""
    flax_file = directory / name / FLAX_WEIGHTS[name]
    if name == "unet" and unet:
        files = [resolve_unet_file(unet)]
    elif flax_file.is_file():
        return _flax_weights(flax_file, module), "flax"
    else:
        files = pytorch_weight_files(directory / name, name, variant)
        if files is None:
            raise CheckpointError(f"{directory / name} has neither Flax nor PyTorch safetensors weights.")
    # transformers' text encoders have an empty base-model prefix (""), diffusers' models none (None).
    prefix = "" if name.startswith("text_encoder") else None
    converted = load_converted(
        files,
        module.init_weights,
        component=name,
        dtype=dtype,
        config=dataclasses.asdict(module.config),
        model_prefix=prefix,
        use_cache=use_cache,
    )
    return converted.params, "conversion cache" if converted.cached else "converted"


def _flax_weights(file: Path, module) -> dict:
    """A Flax msgpack weight file (what diffusers' and transformers' `save_pretrained` write), checked against the
    tree `module` has for its config: a missing, extra or misshapen weight is named in one line."""
    import jax
    from flax.serialization import msgpack_restore
    from flax.traverse_util import flatten_dict

    params = msgpack_restore(file.read_bytes())
    expected = flatten_dict(jax.eval_shape(module.init_weights, jax.random.PRNGKey(0)), sep="/")
    found = flatten_dict(params, sep="/") if isinstance(params, dict) else {}
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = sorted(k for k in expected if k in found and tuple(np.shape(found[k])) != tuple(expected[k].shape))
    if missing or extra or wrong:
        first = (missing or extra or wrong)[0]
        if missing:
            what = f"lacks weight {first}"
        elif extra:
            what = f"has a weight its config has not, {first}"
        else:
            shapes = tuple(np.shape(found[first])), tuple(expected[first].shape)
            what = f"has weight {first} shaped {shapes[0]}, its config {shapes[1]}"
        more = len(missing) + len(extra) + len(wrong) - 1
        raise CheckpointError(
            f"{file} does not fit its config.json: it {what}"
            + (f" ({more} more differ)" if more else "")
            + "; are the weights and the config from the same model?"
        )
    return params
