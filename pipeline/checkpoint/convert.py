"""PyTorch safetensors in diffusers' layout -> Flax parameters, one tensor at a time, without torch.

Most SDXL checkpoints (fine-tunes, SDXL-Lightning's UNets, SDXL-Turbo) ship only PyTorch `*.safetensors`; the
libraries' own `from_pt=True` paths need torch and build a random model first. Here each tensor is read from the
safetensors file into its own NumPy array (`SafetensorsReader`), renamed and reshaped by the libraries' per-tensor
rules (`pt_names.py`: diffusers' for the UNet and VAE, transformers' for the CLIP text encoders), checked
against the shapes the network's (`device/nets/`) `init_weights` would create (traced with `jax.eval_shape`, so
nothing is allocated), and cast to the target dtype before the next tensor is read: host memory peaks at the
converted model plus one tensor.

Converted, cast weights are cached (`<cache root>/converted/<key>/`, key = source files' path, size and mtime +
dtype + config + CONVERTER_VERSION) in one safetensors file per component with a manifest written last; an entry
whose manifest, sizes or checksums do not match is rebuilt, never loaded.

Imported inside functions: jax and flax (heavy: `loading.resolve_model` calls `check_single_file` before the CPU
device count is set and JAX starts).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: safetensors needs it to read bf16 tensors)
import numpy as np
from safetensors.numpy import save_file

from ..contract.errors import CheckpointError
from .cache import default_cache_root
from .pt_names import diffusers_key, rename_diffusers, rename_transformers

logger = logging.getLogger(__name__)

#: Bump when the conversion's output changes: cache entries of older versions are then ignored.
CONVERTER_VERSION = "1"
#: PyTorch weight file stems in diffusers' layout (models) and transformers' (text encoders).
PT_STEMS = {"unet": "diffusion_pytorch_model", "vae": "diffusion_pytorch_model"}
PT_TEXT_STEM = "model"
#: Buffers PyTorch checkpoints carry that are no Flax parameter (older CLIP text encoders save position_ids).
DROPPED_SUFFIXES = ("position_ids", "num_batches_tracked")
_NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
#: safetensors dtype names -> NumPy (bfloat16 through ml_dtypes).
_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_MANIFEST = "manifest.json"
_PARAMS_FILE = "params.safetensors"


@dataclass(frozen=True)
class Converted:
    """One component's Flax parameters and how they were obtained."""

    params: dict  # nested {name: ... : np.ndarray} in the target dtype, the tree `init_weights` would return
    seconds: float  # wall time to convert or to read from the cache
    cached: bool  # True when read from the conversion cache


# ---- finding the files -------------------------------------------------------------------------------------------


def _stem(component: str) -> str:
    return PT_STEMS.get(component, PT_TEXT_STEM)


def pytorch_weight_files(component_dir: Path, component: str, variant: str | None = None) -> list[Path] | None:
    """The safetensors file(s) of one component (single file or the shards an index names); None when absent.

    With a `variant` ("fp16"), `<stem>.<variant>.safetensors` (or `<stem>.safetensors.index.<variant>.json`) is
    preferred; a component without that variant falls back to its plain files, as diffusers does.
    """
    stem = _stem(component)
    names = []
    if variant:
        names += [(f"{stem}.{variant}.safetensors", f"{stem}.safetensors.index.{variant}.json")]
    names += [(f"{stem}.safetensors", f"{stem}.safetensors.index.json")]
    for single, index in names:
        if (component_dir / single).is_file():
            return [component_dir / single]
        if (component_dir / index).is_file():
            return _shards(component_dir / index)
    return None


def weight_variants(component_dir: Path, component: str) -> list[str]:
    """Variants a component's safetensors come in, e.g. ["fp16"] for `<stem>.fp16.safetensors` (or its shards)."""
    stem = _stem(component)
    found = set()
    for file in component_dir.glob(f"{stem}.*.safetensors"):
        middle = file.name[len(stem) + 1 : -len(".safetensors")]  # "fp16" or "fp16-00001-of-00002"
        found.add(middle.split("-", 1)[0])
    for file in component_dir.glob(f"{stem}.safetensors.index.*.json"):
        found.add(file.name[len(stem) + len(".safetensors.index.") : -len(".json")])
    return sorted(found)


def weight_patterns(component: str, variant: str | None = None) -> list[list[str]]:
    """Glob patterns (relative to the checkpoint) of a component's safetensors, in order of preference."""
    stem = _stem(component)
    groups = []
    if variant:
        groups.append(
            [
                f"{component}/{stem}.{variant}.safetensors",
                f"{component}/{stem}.{variant}-*.safetensors",
                f"{component}/{stem}.safetensors.index.{variant}.json",
            ]
        )
    groups.append([f"{component}/{stem}.safetensors", f"{component}/{stem}-*-of-*.safetensors"])
    return groups


def _shards(index_file: Path) -> list[Path]:
    try:
        weight_map = json.loads(index_file.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_file} is not a readable shard index ({exc.__class__.__name__}).") from None
    files = [index_file.parent / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{index_file} names shard {missing[0]}, which is not in {index_file.parent}.")
    return files


# ---- converting ----------------------------------------------------------------------------------------------------


def target_shapes(init_weights) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Flat {Flax key: shape} of what `init_weights(PRNGKey)` returns, traced (no parameter is allocated)."""
    import jax
    from flax.traverse_util import flatten_dict

    shapes = jax.eval_shape(init_weights, jax.random.PRNGKey(0))
    return {key: tuple(leaf.shape) for key, leaf in flatten_dict(shapes).items()}


class _Shape:
    """What the libraries' rename functions look up in their 'random state dict': only `.shape`."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = shape


class SafetensorsReader:
    """Reads a safetensors file tensor by tensor with `os.preadv` into fresh NumPy arrays.

    The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, data_offsets), then
    the data. `safetensors.safe_open` maps the whole file, and every page it touches stays resident: converting the
    4.8 GiB SDXL UNet that way peaked at 10.2 GiB (bench.cpu.convert); reading each tensor into its own buffer keeps
    the peak at the converted model plus one tensor. The header is validated up front, so a truncated or corrupt
    file is refused before anything is converted.
    """

    def __init__(self, file: Path):
        self.file = file
        try:
            self._fd = os.open(file, os.O_RDONLY)
        except OSError as exc:
            raise CheckpointError(f"{file} cannot be opened ({exc.strerror}).") from None
        try:
            size = os.fstat(self._fd).st_size
            length = int.from_bytes(os.pread(self._fd, 8, 0), "little") if size >= 8 else -1
            if not 2 <= length <= min(size - 8, 100_000_000):
                raise ValueError("header length does not fit the file")
            header = json.loads(os.pread(self._fd, length, 8))
            header.pop("__metadata__", None)
            self._start = 8 + length
            self.tensors = {}
            for name, info in header.items():
                begin, end = info["data_offsets"]
                dtype = np.dtype(_SAFETENSORS_DTYPES[info["dtype"]])
                shape = tuple(int(n) for n in info["shape"])
                if not 0 <= begin <= end or end - begin != int(np.prod(shape)) * dtype.itemsize:
                    raise ValueError(f"tensor {name} has inconsistent offsets")
                if self._start + end > size:
                    raise ValueError(f"tensor {name} lies past the end of the file")
                self.tensors[name] = (dtype, shape, self._start + begin, end - begin)
        except (ValueError, KeyError, TypeError) as exc:
            os.close(self._fd)
            detail = " ".join(str(exc).split())[:100] or exc.__class__.__name__
            raise CheckpointError(
                f"{file} is not a readable safetensors file (truncated or corrupt? {detail}); download it again."
            ) from None

    def keys(self) -> list[str]:
        return list(self.tensors)

    def get_tensor(self, name: str) -> np.ndarray:
        dtype, shape, offset, nbytes = self.tensors[name]
        buffer = np.empty(nbytes, np.uint8)
        done = 0
        while done < nbytes:  # one call reads at most ~2 GiB on Linux
            got = os.preadv(self._fd, [buffer[done:]], offset + done)
            if got <= 0:
                raise CheckpointError(f"{self.file} ended early at {name} (truncated?); download it again.")
            done += got
        return buffer.view(dtype).reshape(shape)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def convert_component(
    files: list[Path],
    targets: dict[tuple[str, ...], tuple[int, ...]],
    *,
    component: str,
    dtype: str,
    model_prefix: str | None = None,
) -> dict:
    """Read `files` tensor by tensor and return the Flax parameter tree (nested dicts) in `dtype`.

    `model_prefix` set means transformers' rules (text encoders, whose Flax base-model prefix it is); None means
    diffusers' rules (UNet, VAE). Raises CheckpointError naming the first unmappable key, the first missing
    parameter, or the first shape that does not fit the config.
    """
    from flax.traverse_util import unflatten_dict

    target_dtype = _NUMPY_DTYPES[dtype]
    lookup = {key: _Shape(shape) for key, shape in targets.items()}
    out: dict[tuple[str, ...], np.ndarray] = {}
    handles = [(file, SafetensorsReader(file)) for file in files]
    names = {file: handle.keys() for file, handle in handles}
    first_parts = {key.split(".")[0] for keys in names.values() for key in keys}
    for file, handle in handles:
        with handle as reader:
            for pt_key in names[file]:
                if pt_key.endswith(DROPPED_SUFFIXES):
                    continue
                tensor = reader.get_tensor(pt_key)
                if model_prefix is None:
                    key, value = _rename_diffusers(pt_key, tensor, lookup)
                else:
                    key, value = _rename_transformers(pt_key, tensor, lookup, model_prefix, first_parts)
                if key not in targets:
                    raise CheckpointError(
                        f"{component} weight {pt_key} (in {file.name}) has no place in SDXL's {component}: "
                        "not a diffusers-layout SDXL checkpoint, or a config that does not match its weights."
                    )
                if tuple(value.shape) != targets[key]:
                    raise CheckpointError(
                        f"{component} weight {pt_key} has shape {tuple(tensor.shape)} but {component}/config.json "
                        f"needs {_torch_shape(targets[key], tensor.ndim, value.shape, tensor.shape)}: "
                        "weights and config do not fit."
                    )
                out[key] = np.ascontiguousarray(value, dtype=target_dtype)
                del tensor, value
    missing = [key for key in targets if key not in out]
    if missing:
        raise CheckpointError(
            f"{component} weights lack {'/'.join(missing[0])} ({len(missing)} of {len(targets)} parameters "
            f"missing) in {files[0].parent}: an incomplete checkpoint, or not SDXL's {component}."
        )
    return unflatten_dict(out)


def _torch_shape(flax_shape, ndim, flax_value_shape, torch_shape) -> tuple:
    """The shape the config needs, said in the file's (PyTorch) axis order when the tensor was transposed."""
    if tuple(flax_value_shape) == tuple(torch_shape):
        return tuple(flax_shape)
    if ndim == 4:
        return (flax_shape[3], flax_shape[2], flax_shape[0], flax_shape[1])
    return tuple(reversed(flax_shape))


def _rename_diffusers(pt_key: str, tensor: np.ndarray, lookup: dict):
    return rename_diffusers(diffusers_key(pt_key), tensor, lookup)


def _rename_transformers(pt_key: str, tensor: np.ndarray, lookup: dict, prefix: str, first_parts: set[str]):
    """transformers' `convert_pytorch_state_dict_to_flax`, one tensor at a time (its prefix rules included)."""
    top = {key[0] for key in lookup}
    pt_tuple = tuple(pt_key.split("."))
    if prefix not in top and prefix in first_parts and pt_tuple[0] == prefix:
        pt_tuple = pt_tuple[1:]
    key, value = rename_transformers(pt_tuple, tensor, lookup, prefix)
    if prefix in top and prefix not in first_parts and (prefix, *key) in lookup:
        key = (prefix, *key)
    return key, value


# ---- the cache -----------------------------------------------------------------------------------------------------


def cache_root() -> Path:
    return default_cache_root() / "converted"


def cache_key(files: list[Path], *, component: str, dtype: str, config: dict) -> str:
    """Identity of a conversion: source files (resolved path, size, mtime), dtype, config and converter version."""
    sources = []
    for file in files:
        stat = file.stat()
        sources.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    text = json.dumps(
        {"v": CONVERTER_VERSION, "component": component, "dtype": dtype, "config": config, "sources": sources},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8))  # bytes of any dtype, bf16 too


def read_cache(entry: Path) -> dict | None:
    """The cached parameter tree, or None when the entry is absent or fails its manifest (then it is removed)."""
    from flax.traverse_util import unflatten_dict

    manifest_file = entry / _MANIFEST
    if not manifest_file.is_file():
        if entry.exists():
            logger.warning("conversion cache entry %s is incomplete; rebuilding it", entry)
            shutil.rmtree(entry, ignore_errors=True)
        return None
    try:
        manifest = json.loads(manifest_file.read_text())
        params_file = entry / _PARAMS_FILE
        if params_file.stat().st_size != manifest["size"]:
            raise ValueError("size differs from the manifest")
        flat = {}
        with SafetensorsReader(params_file) as reader:
            names = reader.keys()
            if sorted(names) != sorted(manifest["crc32"]):
                raise ValueError("tensor names differ from the manifest")
            for name in names:
                array = reader.get_tensor(name)
                if _crc(array) != manifest["crc32"][name]:
                    raise ValueError(f"checksum of {name} differs from the manifest")
                flat[tuple(name.split("/"))] = array
        return unflatten_dict(flat)
    except Exception as exc:  # any damage at all: never load it, rebuild it
        logger.warning("conversion cache entry %s is damaged (%s); rebuilding it", entry, exc)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def write_cache(entry: Path, params: dict) -> None:
    """Write into a temporary directory beside `entry`, manifest last, then rename it into place (atomic)."""
    from flax.traverse_util import flatten_dict

    flat = {"/".join(key): value for key, value in flatten_dict(params).items()}
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        save_file(flat, str(staging / _PARAMS_FILE))
        manifest = {
            "version": CONVERTER_VERSION,
            "size": (staging / _PARAMS_FILE).stat().st_size,
            "crc32": {name: _crc(value) for name, value in flat.items()},
        }
        (staging / _MANIFEST).write_text(json.dumps(manifest))
        with contextlib.suppress(OSError):  # another process placed it first: keep theirs
            os.replace(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_converted(
    files: list[Path],
    init_weights,
    *,
    component: str,
    dtype: str,
    config: dict,
    model_prefix: str | None = None,
    use_cache: bool = True,
) -> Converted:
    """Converted parameters of one component: from the cache when a valid entry exists, else converted (and cached)."""
    started = time.perf_counter()
    entry = cache_root() / cache_key(files, component=component, dtype=dtype, config=config) if use_cache else None
    if entry is not None:
        params = read_cache(entry)
        if params is not None:
            return Converted(params=params, seconds=time.perf_counter() - started, cached=True)
    params = convert_component(
        files, target_shapes(init_weights), component=component, dtype=dtype, model_prefix=model_prefix
    )
    if entry is not None:
        try:
            write_cache(entry, params)
        except OSError as exc:  # a full or read-only disk costs the next start a conversion, nothing else
            logger.warning("could not write the conversion cache %s: %s", entry, exc)
            with contextlib.suppress(OSError):
                shutil.rmtree(entry, ignore_errors=True)
    return Converted(params=params, seconds=time.perf_counter() - started, cached=False)


def check_single_file(path: Path) -> None:
    """A lone .safetensors given as --model: say what to pass instead (A1111-style files are not diffusers' layout)."""
    raise CheckpointError(
        f"{path} is a single-file checkpoint (A1111/ComfyUI style); pass a directory in diffusers' layout "
        "(model_index.json + unet/, vae/, text_encoder*/ ...), or a whole-UNet file with --unet and a base --model."
    )
