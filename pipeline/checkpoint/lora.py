"""LoRA files: read a .safetensors LoRA, recognise its format, map it onto the checkpoint's Flax kernels, check it.

No torch: tensors are read with the `safetensors` NumPy API (bfloat16 through ml_dtypes). The header is read and
checked first, so a file of an unsupported kind (LyCORIS LoHa/LoKr, DoRA, ...), a corrupt or truncated file, or one
whose layers have no place in this checkpoint is refused before any tensor is read. Every refusal is one
`LoraFileError` whose message is one sentence naming the file and the reason; `load_lora_dir` logs it and goes on.

Formats read (what diffusers' `StableDiffusionXLLoraLoaderMixin.load_lora_weights` reads, minus DoRA):
- kohya / A1111: `lora_unet_<module>`, `lora_te1_<module>`, `lora_te2_<module>` (`lora_te_` = the first text
  encoder) with `.lora_down.weight`, `.lora_up.weight` and `.alpha` (missing alpha = rank). The UNet module comes
  in two spellings: the SGM names kohya writes for SDXL (`input_blocks_4_1_transformer_blocks_0_attn1_to_q`) and
  diffusers' names (`down_blocks_1_attentions_0_transformer_blocks_0_attn1_to_q`). Conv layers (LoCon: 3x3 and
  1x1 kernels) included.
- diffusers / PEFT: `unet.<module>.lora_A.weight` / `.lora_B.weight`, `text_encoder.…`, `text_encoder_2.…`, alpha
  from the `lora_adapter_metadata` JSON diffusers writes (`unet.lora_alpha`, `unet.alpha_pattern`, `unet.r`, ...);
  a component without metadata uses alpha = rank.

Spellings are not parsed: every accepted spelling of every kernel is generated from the checkpoint itself (its
parameter tree and its UNet config's `layers_per_block` and block types, as diffusers'
`_maybe_map_sgm_blocks_to_diffusers` uses them) and looked up, so a LoRA for any SDXL-architecture checkpoint maps,
the tiny test model included, and nothing is mapped by a guess.

A layer's change to a kernel, in the Flax layout, is `weight × scale × down @ up` reshaped to the kernel: `down`
[K, r] (K = the kernel's input size, kh·kw·in for a conv, in Flax's axis order) and `up` [r, out], both float32,
scale = alpha / r (alpha / sqrt(r) for rsLoRA).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy: safetensors needs it to read bf16 tensors)
import numpy as np
from safetensors import safe_open

from ..contract.errors import CheckpointError

logger = logging.getLogger(__name__)

#: The components a LoRA may change, in the order outputs list them.
COMPONENTS = ("unet", "text_encoder", "text_encoder_2")
#: How logs and messages name them.
COMPONENT_LABELS = {"unet": "UNet", "text_encoder": "TE1", "text_encoder_2": "TE2"}
#: A kernel of the checkpoint: (component, *path in its Flax parameter tree), e.g.
#: ("unet", "down_blocks_1", "attentions_0", "transformer_blocks_0", "attn1", "to_q", "kernel").
LeafPath = tuple[str, ...]
#: Largest safetensors header read (the format's own parsers refuse bigger ones too).
MAX_HEADER_BYTES = 100_000_000
#: How many characters of A1111's hash its `Lora hashes` field shows (extensions-builtin/Lora/network.py).
SHORT_HASH_CHARS = 12
#: Characters a LoRA name may not have: they would break the `<lora:NAME:weight>` prompt syntax.
_BAD_NAME_CHARS = set(":<>,") | {"\n", "\r", "\t"}
#: safetensors dtype names -> NumPy; LoRA factors are floating point.
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_SAFETENSORS_ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
#: kohya's suffixes per module, and diffusers/PEFT's.
_KOHYA_SUFFIXES = {"lora_down.weight": "down", "lora_up.weight": "up", "alpha": "alpha"}
_PEFT_SUFFIXES = {"lora_A.weight": "down", "lora_B.weight": "up"}
_KOHYA_PREFIXES = {
    "lora_unet_": "unet",
    "lora_te1_": "text_encoder",
    "lora_te_": "text_encoder",
    "lora_te2_": "text_encoder_2",
}
_PEFT_PREFIXES = {"unet.": "unet", "text_encoder.": "text_encoder", "text_encoder_2.": "text_encoder_2"}
#: Tensor names of network kinds this app does not apply, checked before anything else: (pattern, kind).
_UNSUPPORTED = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"\.hada_(w[12]_[ab]|t[12])$", "a LyCORIS LoHa file (hada_* weights)"),
        (r"\.lokr_(w[12](_[ab])?|t2)$", "a LyCORIS LoKr file (lokr_* weights)"),
        (r"\.dora_scale$", "a DoRA file (dora_scale weights)"),
        (r"\.lora_magnitude_vector(\.weight)?$", "a DoRA file (lora_magnitude_vector weights)"),
        (r"\.lora_mid\.weight$", "a LyCORIS LoCon file with CP decomposition (lora_mid weights)"),
        (r"\.(oft_blocks|oft_diag|oft_r(\.weight)?)$", "an OFT file"),
        (r"\.boft_", "a BOFT file"),
        (r"\.(a1|a2|b1|b2)\.weight$", "a LyCORIS GLoRA file"),
        (r"\.on_input$", "an (IA)³ file"),
        (r"\.diff(_b)?$", "a LyCORIS full-weight difference file (.diff weights)"),
        (r"\.(w_norm|b_norm)$", "a LyCORIS norm-layer file (w_norm weights)"),
        (r"\.lora_B\.bias$", "a LoRA with bias terms (lora_B.bias)"),
    )
)
#: Tensor-name markers of LoRAs for other model families: (marker, family).
_OTHER_MODELS = (
    ("double_blocks", "Flux"),
    ("single_blocks", "Flux"),
    ("single_transformer_blocks", "Flux"),
    ("joint_blocks", "SD3"),
    ("lora_transformer_", "a transformer model (Flux, SD3, ...)"),
    ("transformer.", "a transformer model (Flux, SD3, ...)"),
)


class LoraFileError(CheckpointError):
    """A LoRA file that is refused; str(error) is one sentence naming the file and the reason."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the safetensors header describes it."""

    dtype: str  # safetensors dtype name: "F16", "BF16", "F32", ...
    shape: tuple[int, ...]  # as stored (PyTorch layout)


@dataclass(frozen=True)
class SafetensorsHeader:
    """What the first bytes of a .safetensors file say, checked against the file's size."""

    tensors: dict[str, TensorInfo]  # tensor name -> dtype and shape
    metadata: dict[str, str]  # the `__metadata__` strings (kohya's ss_*, diffusers' lora_adapter_metadata, ...)
    data_start: int  # byte offset of the tensor data (8 + header length): A1111's hash covers the bytes from here
    size: int  # file size in bytes


@dataclass(frozen=True)
class LoraLayer:
    """One kernel a LoRA changes: its factors in the Flax layout, float32."""

    down: np.ndarray  # float32 [K, r]: K = kernel input size (kh·kw·in for a conv, flattened in Flax order)
    up: np.ndarray  # float32 [r, out]
    scale: float  # alpha / r (alpha / sqrt(r) for rsLoRA): the change at weight 1 is scale · down @ up
    module: str  # the module's name in the file (for messages), e.g. lora_unet_input_blocks_4_1_proj_in

    @property
    def rank(self) -> int:
        return int(self.down.shape[1])


@dataclass(frozen=True)
class LoraFile:
    """An accepted LoRA file, mapped onto the checkpoint."""

    name: str  # the file's stem: what `<lora:NAME:weight>` refers to
    path: Path  # where it was read from
    format: str  # "kohya (SGM names)", "kohya (diffusers names)" or "diffusers/PEFT"
    layers: dict[LeafPath, LoraLayer]  # every kernel it changes -> its factors
    size_bytes: int  # file size
    addnet_hash: str  # A1111's hash: metadata `sshs_model_hash`, else sha256 of the bytes after the header (64 hex)
    metadata: dict[str, str] = field(default_factory=dict, repr=False)  # the file's `__metadata__`

    @property
    def short_hash(self) -> str:
        """What A1111 writes in `Lora hashes`: the first 12 hex characters of `addnet_hash`."""
        return self.addnet_hash[:SHORT_HASH_CHARS]

    @property
    def ranks(self) -> tuple[int, ...]:
        """The distinct ranks of its layers, ascending."""
        return tuple(sorted({layer.rank for layer in self.layers.values()}))

    @property
    def components(self) -> tuple[str, ...]:
        """The components it changes, in COMPONENTS order."""
        touched = {leaf[0] for leaf in self.layers}
        return tuple(c for c in COMPONENTS if c in touched)

    def describe(self) -> str:
        """One log line, e.g. "style: kohya (SGM names), rank 8, UNet 70 + TE1 12 layers, 1.2 MB, hash 0123456789ab"."""
        ranks = self.ranks
        rank = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        counts = {c: sum(1 for leaf in self.layers if leaf[0] == c) for c in self.components}
        touched = " + ".join(f"{COMPONENT_LABELS[c]} {n}" for c, n in counts.items())
        size = _megabytes(self.size_bytes)
        return f"{self.name}: {self.format}, {rank}, {touched} layers, {size}, hash {self.short_hash}"


@dataclass(frozen=True)
class LoraTargets:
    """Every kernel of one checkpoint a LoRA may change, and every spelling files use for it (built once)."""

    shapes: dict[LeafPath, tuple[int, ...]]  # kernel -> its Flax shape ([in, out], or [kh, kw, in, out] for a conv)
    kohya: dict[str, LeafPath]  # kohya module name (both UNet spellings, lora_te_/te1_/te2_) -> kernel
    peft: dict[str, LeafPath]  # diffusers/PEFT module name (`unet.down_blocks.1. …`) -> kernel


@dataclass(frozen=True)
class LoraDirectory:
    """The outcome of reading `--lora-dir`: the accepted files, and one line per refused one."""

    loras: list[LoraFile]  # accepted, by name
    refused: list[str]  # one sentence per refused file, naming it


# ---- the checkpoint's side: every kernel and its spellings ---------------------------------------------------------


def lora_targets(unet_config: Mapping[str, Any], shapes: Mapping[str, Any]) -> LoraTargets:
    """The kernels of a checkpoint and their names in LoRA files.

    `unet_config`: the UNet's config (config.json fields; `layers_per_block`, `down_block_types`, `up_block_types`
    are read). `shapes`: {"unet", "text_encoder", "text_encoder_2": that component's Flax parameter tree}, whose
    leaves are arrays, `jax.ShapeDtypeStruct`s or shape tuples (only shapes are read).
    """
    missing = [c for c in COMPONENTS if c not in shapes]
    if missing:
        raise ValueError(f"lora_targets needs the parameter shapes of {', '.join(missing)}")
    kernels: dict[LeafPath, tuple[int, ...]] = {}
    kohya: dict[str, LeafPath | None] = {}
    peft: dict[str, LeafPath | None] = {}

    def add(table: dict, name: str, leaf: LeafPath) -> None:
        if table.get(name, leaf) != leaf:  # two kernels with one spelling: never guess which one is meant
            table[name] = None
        else:
            table[name] = leaf

    sgm = _SgmNames(unet_config)
    for component in COMPONENTS:
        for path, shape in _flat_shapes(shapes[component]):
            if path[-1] != "kernel" or len(shape) not in (2, 4):
                continue
            leaf = (component, *path)
            kernels[leaf] = shape
            if component == "unet":
                module = _unet_module(path[:-1])
                add(kohya, "lora_unet_" + module.replace(".", "_"), leaf)
                sgm_module = sgm.name(module)
                if sgm_module is not None:
                    add(kohya, "lora_unet_" + sgm_module.replace(".", "_"), leaf)
                add(peft, "unet." + module, leaf)
            else:
                module = ".".join(path[:-1])
                prefixes = ("lora_te1_", "lora_te_") if component == "text_encoder" else ("lora_te2_",)
                for prefix in prefixes:
                    add(kohya, prefix + module.replace(".", "_"), leaf)
                add(peft, f"{component}.{module}", leaf)
    return LoraTargets(
        shapes=kernels,
        kohya={k: v for k, v in kohya.items() if v is not None},
        peft={k: v for k, v in peft.items() if v is not None},
    )


def _flat_shapes(tree, prefix: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], tuple[int, ...]]]:
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _flat_shapes(value, (*prefix, str(key)))
    else:
        yield prefix, tuple(int(n) for n in (tree.shape if hasattr(tree, "shape") else tree))


#: Flax module names diffusers gives PyTorch's `name.N` (its `rename_key`: `down_blocks.1` -> `down_blocks_1`).
_INDEXED = re.compile(
    r"^(down_blocks|up_blocks|attentions|resnets|transformer_blocks|downsamplers|upsamplers|to_out|net)_(\d+)$"
)
#: Older Flax attention names -> PyTorch's (diffusers' Flax attention once used query/key/value/proj_attn).
_FLAX_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def _unet_module(flax_path: tuple[str, ...]) -> str:
    """A UNet kernel's Flax module path -> diffusers' PyTorch module name, e.g. `down_blocks.1.attentions.0.proj_in`."""
    parts = []
    for part in flax_path:
        match = _INDEXED.match(part)
        parts.append(f"{match.group(1)}.{match.group(2)}" if match else _FLAX_ATTENTION.get(part, part))
    return ".".join(parts)


class _SgmNames:
    """diffusers UNet module names -> the SGM (original Stability) names kohya writes for SDXL.

    The inverse of diffusers' `_maybe_map_sgm_blocks_to_diffusers` + `_convert_unet_lora_key`: input block
    1 + Σ(layers + 1) + j holds down block b's resnet j (`.0`) and attention j (`.1`), the block's downsampler
    sits in the next index (`.0.op`); output block Σ(layers + 1) + j holds up block b's resnet j and attention j
    (up blocks have one resnet more), its upsampler sits with the last one (`.2.conv` after an attention, `.1.conv`
    without). Middle block 0, 1, 2: resnet 0, attention 0, resnet 1.
    """

    _RESNET = {
        "conv1": "in_layers.2",
        "conv2": "out_layers.3",
        "time_emb_proj": "emb_layers.1",
        "conv_shortcut": "skip_connection",
    }
    _TOP = {
        "conv_in": "input_blocks.0.0",
        "conv_out": "out.2",
        "time_embedding.linear_1": "time_embed.0",
        "time_embedding.linear_2": "time_embed.2",
        "add_embedding.linear_1": "label_emb.0.0",
        "add_embedding.linear_2": "label_emb.0.2",
    }

    def __init__(self, config: Mapping[str, Any]):
        down_types = list(config.get("down_block_types") or ())
        up_types = list(config.get("up_block_types") or ())
        layers = config.get("layers_per_block", 2)
        layers = [int(layers)] * len(down_types) if isinstance(layers, int) else [int(n) for n in layers]
        self.down_layers = layers  # resnets per down block
        self.up_layers = [n + 1 for n in reversed(layers)]  # resnets per up block
        self.up_attention = ["CrossAttn" in t for t in up_types]
        self.down_start = [1 + sum(n + 1 for n in layers[:b]) for b in range(len(layers))]
        self.up_start = [sum(self.up_layers[:b]) for b in range(len(self.up_layers))]

    def name(self, module: str) -> str | None:
        for top, sgm in self._TOP.items():
            if module == top:
                return sgm
        parts = module.split(".")
        try:
            if parts[0] == "down_blocks":
                b, kind, j, rest = int(parts[1]), parts[2], int(parts[3]), parts[4:]
                if kind == "downsamplers":
                    return f"input_blocks.{self.down_start[b] + self.down_layers[b]}.0.op"
                return self._inner(f"input_blocks.{self.down_start[b] + j}", kind, rest)
            if parts[0] == "mid_block":
                kind, j, rest = parts[1], int(parts[2]), parts[3:]
                index = {("resnets", 0): 0, ("attentions", 0): 1, ("resnets", 1): 2}[(kind, j)]
                return self._inner(f"middle_block.{index}", kind, rest, sub=False)
            if parts[0] == "up_blocks":
                b, kind, j, rest = int(parts[1]), parts[2], int(parts[3]), parts[4:]
                if kind == "upsamplers":
                    last = self.up_start[b] + self.up_layers[b] - 1
                    return f"output_blocks.{last}.{2 if self.up_attention[b] else 1}.conv"
                return self._inner(f"output_blocks.{self.up_start[b] + j}", kind, rest)
        except (IndexError, KeyError, ValueError):
            return None
        return None

    def _inner(self, block: str, kind: str, rest: list[str], sub: bool = True) -> str | None:
        if kind == "resnets":
            inner = self._RESNET.get(".".join(rest))
            return None if inner is None else f"{block}{'.0' if sub else ''}.{inner}"
        if kind == "attentions":
            return f"{block}{'.1' if sub else ''}.{'.'.join(rest)}"
        return None


# ---- the file's side -------------------------------------------------------------------------------------------------


def read_header(path: Path) -> SafetensorsHeader:
    """The header of a .safetensors file, checked: every tensor's bytes lie inside the file and fit its shape."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            length = int.from_bytes(file.read(8), "little") if size >= 8 else -1
            if not 2 <= length <= min(size - 8, MAX_HEADER_BYTES):
                raise ValueError("its header length does not fit the file")
            header = json.loads(file.read(length))
    except OSError as exc:
        raise LoraFileError(f"{path.name} cannot be read ({exc.strerror or exc.__class__.__name__}).") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from None
    try:
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        if not isinstance(metadata, dict):
            raise ValueError("its metadata is not a JSON object")
        data_start = 8 + length
        tensors = {}
        for name, info in header.items():
            begin, end = (int(n) for n in info["data_offsets"])
            shape = tuple(int(n) for n in info["shape"])
            itemsize = _SAFETENSORS_ITEMSIZE.get(info["dtype"])
            if itemsize is None:
                raise ValueError(f"unknown dtype {_clip(info['dtype'], 12)} ({_clip(name, 40)})")
            if not 0 <= begin <= end or end - begin != math.prod(shape) * itemsize:
                raise ValueError(f"tensor offsets do not fit its shape ({_clip(name, 40)})")
            if data_start + end > size:
                raise ValueError(f"tensor data lies past the end of the file ({_clip(name, 40)})")
            tensors[name] = TensorInfo(dtype=str(info["dtype"]), shape=shape)
    except (ValueError, KeyError, TypeError) as exc:
        raise _unreadable(path, exc) from None
    return SafetensorsHeader(
        tensors=tensors, metadata={str(k): str(v) for k, v in metadata.items()}, data_start=data_start, size=size
    )


def addnet_hash(path: Path, data_start: int) -> str:
    """sha256 of the file's bytes after the header: the "addnet" hash kohya writes and A1111 shows (64 hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        file.seek(data_start)
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def a1111_hash(path: Path, header: SafetensorsHeader) -> str:
    """A1111's LoRA hash: the metadata's `sshs_model_hash` (kohya writes it on save) when present, else computed.

    A1111 (extensions-builtin/Lora/network.py, NetworkOnDisk) uses `metadata.get('sshs_model_hash')` or
    `hashes.sha256_from_cache(..., use_addnet_hash=True)`, i.e. `addnet_hash_safetensors` in modules/hashes.py.
    """
    stored = header.metadata.get("sshs_model_hash", "").strip().lower()
    if re.fullmatch(r"[0-9a-f]{12,64}", stored):
        return stored
    return addnet_hash(path, header.data_start)


#: Layers SDXL's UNet does not have (its first down block and the fourth up block hold no attention): an SD 1.x/2.x
#: LoRA, known from its tensor names alone.
_SD1_LAYOUT = re.compile(
    r"^(lora_unet_(down_blocks_0_attentions|up_blocks_3_)|unet\.(down_blocks\.0\.attentions|up_blocks\.3\.))"
)


def _screen(path: Path) -> tuple[Any, str, dict[str, dict[str, str]]]:
    """The checks of one LoRA file that need no model (its name, header, kind and block layout): (header, "kohya" or
    "peft", modules); raises LoraFileError (one sentence) when it is refused."""
    name = path.stem
    bad = sorted(set(name) & _BAD_NAME_CHARS)
    if bad or not name.strip():
        raise LoraFileError(
            f"{path.name} has a name a prompt cannot refer to (it holds {' '.join(map(repr, bad))}); rename the file."
            if bad
            else f"{path.name} has an empty name; rename the file."
        )
    header = read_header(path)
    names = list(header.tensors)
    if not names:
        raise LoraFileError(f"{path.name} holds no tensors.")
    _refuse_unsupported(path, names, header.metadata)
    kind, modules = _group(path, names)
    if foreign := next((m for m in modules if _SD1_LAYOUT.match(m)), None):
        raise LoraFileError(_not_this_model(path, foreign, header.metadata, kind))
    return header, kind, modules


def screen_lora_dir(directory: str | Path) -> tuple[list[str], dict[str, str]]:
    """What `load_lora_dir` will offer, told before the model loads, from each file's header alone (names, kind,
    DoRA/LoHa/LoKr, SD 1.x layout, damage): (accepted names, {refused name: one sentence why}). Loading may still
    refuse a file whose layers do not fit this checkpoint's shapes. A missing directory raises LoraFileError."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LoraFileError(f"LoRA directory {directory} does not exist or is not a directory.")
    names, refused = [], {}
    for path in sorted(p for p in directory.glob("*.safetensors") if p.is_file()):
        try:
            _screen(path)
        except LoraFileError as exc:
            refused[path.stem] = str(exc)
            continue
        names.append(path.stem)
    return names, refused


def load_lora(path: str | Path, targets: LoraTargets) -> LoraFile:
    """Read, recognise, map and check one LoRA file; raise LoraFileError (one sentence) when it is refused."""
    path = Path(path)
    name = path.stem
    header, kind, modules = _screen(path)
    table = targets.kohya if kind == "kohya" else targets.peft
    leaves: dict[str, LeafPath] = {}
    for module in modules:
        leaf = table.get(module)
        if leaf is None:
            raise LoraFileError(_not_this_model(path, module, header.metadata, kind))
        leaves[module] = leaf
    seen: dict[LeafPath, str] = {}
    for module, leaf in leaves.items():
        if leaf in seen:
            raise LoraFileError(f"{path.name} changes one layer twice ({seen[leaf]} and {module}).")
        seen[leaf] = module
    alphas = _peft_alphas(path, header.metadata) if kind == "peft" else {}
    if kind == "kohya":
        unet = [m for m in modules if m.startswith("lora_unet_")]
        sgm = any(
            re.match(r"lora_unet_(input_blocks|middle_block|output_blocks|out_2|time_embed|label_emb)", m) for m in unet
        )
        file_format = "kohya (SGM names)" if sgm else "kohya (diffusers names)"
    else:
        file_format = "diffusers/PEFT"
    layers = _read_layers(path, header, kind, modules, leaves, targets, alphas)
    return LoraFile(
        name=name,
        path=path,
        format=file_format,
        layers=layers,
        size_bytes=header.size,
        addnet_hash=a1111_hash(path, header),
        metadata=header.metadata,
    )


def load_lora_dir(directory: str | Path, targets: LoraTargets) -> LoraDirectory:
    """Every `*.safetensors` in `directory` (sorted by name): accepted ones, and one line per refused one (logged)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LoraFileError(f"LoRA directory {directory} does not exist or is not a directory.")
    loras, refused = [], []
    for path in sorted(directory.glob("*.safetensors")):
        if not path.is_file():
            continue
        try:
            lora = load_lora(path, targets)
        except LoraFileError as exc:
            refused.append(str(exc))
            logger.warning("LoRA refused: %s", exc)
            continue
        loras.append(lora)
        logger.info("LoRA %s", lora.describe())
    return LoraDirectory(loras=loras, refused=refused)


# ---- recognising and reading ---------------------------------------------------------------------------------------


def _refuse_unsupported(path: Path, names: list[str], metadata: Mapping[str, str]) -> None:
    for pattern, kind in _UNSUPPORTED:
        if any(pattern.search(n) for n in names):
            raise LoraFileError(f"{path.name} is {kind}, which this app does not apply (only LoRA and LoCon).")
    adapter = _adapter_metadata(path, metadata)
    if any(k.endswith(".use_dora") and v for k, v in adapter.items()):
        raise LoraFileError(f"{path.name} is a DoRA file (use_dora in its metadata), which this app does not apply.")


def _group(path: Path, names: list[str]) -> tuple[str, dict[str, dict[str, str]]]:
    """("kohya" or "peft", {module name: {"down"/"up"/"alpha": tensor name}}), or a refusal."""
    kohya = all(n.startswith(tuple(_KOHYA_PREFIXES)) for n in names)
    peft = all(n.startswith(tuple(_PEFT_PREFIXES)) for n in names)
    if not (kohya or peft):
        for marker, family in _OTHER_MODELS:
            if any(n.startswith(marker) or f"_{marker}" in n or f".{marker}" in n for n in names):
                raise LoraFileError(f"{path.name} is a LoRA for {family}, not for an SDXL checkpoint.")
        odd = next(n for n in names if not n.startswith(tuple(_KOHYA_PREFIXES) + tuple(_PEFT_PREFIXES)))
        raise LoraFileError(
            f"{path.name} is not a LoRA file this app reads (tensor {_clip(odd)} has neither kohya's "
            "lora_unet_/lora_te… nor diffusers' unet./text_encoder… names)."
        )
    suffixes = _KOHYA_SUFFIXES if kohya else _PEFT_SUFFIXES
    modules: dict[str, dict[str, str]] = {}
    for name in names:
        for suffix, role in suffixes.items():
            if name.endswith("." + suffix):
                modules.setdefault(name[: -len(suffix) - 1], {})[role] = name
                break
        else:
            expected = "lora_down.weight, lora_up.weight, alpha" if kohya else "lora_A.weight, lora_B.weight"
            raise LoraFileError(
                f"{path.name} holds tensor {_clip(name)}, which is not a LoRA factor ({expected}); "
                "an unsupported network kind."
            )
    for module, roles in modules.items():
        if "down" not in roles or "up" not in roles:
            lacking = "down" if "down" not in roles else "up"
            raise LoraFileError(f"{path.name} has no {lacking} factor for {_clip(module)} (an incomplete file).")
    return ("kohya" if kohya else "peft"), modules


def _not_this_model(path: Path, module: str, metadata: Mapping[str, str], kind: str) -> str:
    base = metadata.get("ss_base_model_version") or metadata.get("modelspec.architecture") or ""
    hint = f" (its metadata says {_clip(base)})" if base and "xl" not in base.lower() else ""
    family = next((family for marker, family in _OTHER_MODELS if marker.rstrip(".") in module), None)
    if family:
        hint = hint or f" (a LoRA for {family})"
    elif kind == "kohya" and re.match(r"lora_unet_(down_blocks_0_attentions|up_blocks_3_attentions)", module):
        hint = hint or " (SD 1.x/2.x block layout)"
    return f"{path.name} is not for this checkpoint{hint}: its layer {_clip(module)} has no place in this SDXL model."


def _adapter_metadata(path: Path, metadata: Mapping[str, str]) -> dict[str, Any]:
    raw = metadata.get("lora_adapter_metadata")
    if not raw:
        return {}
    try:
        adapter = json.loads(raw)
    except ValueError:
        raise LoraFileError(f"{path.name} has unreadable lora_adapter_metadata (not JSON).") from None
    if not isinstance(adapter, dict):
        raise LoraFileError(f"{path.name} has lora_adapter_metadata that is not a JSON object.")
    return adapter


def _peft_alphas(path: Path, metadata: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Per component: {"lora_alpha", "alpha_pattern", "use_rslora"} from diffusers' lora_adapter_metadata."""
    adapter = _adapter_metadata(path, metadata)
    out: dict[str, dict[str, Any]] = {}
    for component in COMPONENTS:
        fields = {k[len(component) + 1 :]: v for k, v in adapter.items() if k.startswith(component + ".")}
        if fields:
            out[component] = fields
    return out


def _peft_scale(path: Path, module: str, component: str, rank: int, alphas: Mapping[str, Mapping[str, Any]]) -> float:
    """PEFT's scaling for one module: alpha_pattern's match (PEFT's `get_pattern_key`), else lora_alpha; no
    metadata: alpha = rank. rsLoRA divides by sqrt(rank)."""
    fields = alphas.get(component)
    if not fields:
        return 1.0
    alpha = fields.get("lora_alpha", rank)
    relative = module[len(component) + 1 :]
    for pattern, value in (fields.get("alpha_pattern") or {}).items():
        try:
            if re.match(rf"(.*\.)?({pattern})$", relative):
                alpha = value
                break
        except re.error:
            raise LoraFileError(
                f"{path.name} has an alpha_pattern key that is no valid pattern ({_clip(pattern)})."
            ) from None
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise LoraFileError(f"{path.name} has a lora_alpha that is not a number ({_clip(str(alpha))}).") from None
    return alpha / (math.sqrt(rank) if fields.get("use_rslora") else rank)


def _read_layers(path, header, kind, modules, leaves, targets, alphas) -> dict[LeafPath, LoraLayer]:
    layers: dict[LeafPath, LoraLayer] = {}
    for roles in modules.values():
        for role in ("down", "up", "alpha"):
            if role in roles and header.tensors[roles[role]].dtype not in _FLOAT_DTYPES:
                info = header.tensors[roles[role]]
                raise LoraFileError(f"{path.name} stores {_clip(roles[role])} as {info.dtype}, not as floating point.")
    try:
        with safe_open(str(path), framework="np") as reader:
            for module, roles in modules.items():
                leaf = leaves[module]
                down = np.asarray(reader.get_tensor(roles["down"]), np.float32)
                up = np.asarray(reader.get_tensor(roles["up"]), np.float32)
                alpha = np.asarray(reader.get_tensor(roles["alpha"]), np.float32) if "alpha" in roles else None
                layers[leaf] = _layer(path, module, leaf, down, up, alpha, targets.shapes[leaf], kind, alphas)
    except LoraFileError:
        raise
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise _unreadable(path, exc) from None
    return layers


def _layer(path, module, leaf, down, up, alpha, kernel_shape, kind, alphas) -> LoraLayer:
    """Check one pair against its kernel and bring it into the Flax layout: down [K, r], up [r, out]."""
    where = f"{path.name} does not fit this checkpoint: {_clip(module)}"
    if down.ndim not in (2, 4) or up.ndim not in (2, 4) or down.shape[0] != up.shape[1] or down.shape[0] < 1:
        shapes = f"{tuple(down.shape)} and {tuple(up.shape)}"
        raise LoraFileError(f"{where} has factors of shapes {shapes}, not a LoRA pair.")
    rank = down.shape[0]
    if up.ndim == 4:
        if up.shape[2:] != (1, 1):
            kernel = f"{up.shape[2]}x{up.shape[3]}"
            raise LoraFileError(f"{where} has an up factor with a {kernel} kernel (a LoRA's is 1x1).")
        up = up[:, :, 0, 0]
    out = kernel_shape[-1]
    if len(kernel_shape) == 2:  # a Linear layer: kernel [in, out]
        if down.ndim == 4:
            if down.shape[2:] != (1, 1):
                raise LoraFileError(f"{where} has a {down.shape[2]}x{down.shape[3]} conv factor for a linear layer.")
            down = down[:, :, 0, 0]
        fan_in = kernel_shape[0]
        if down.shape[1] != fan_in or up.shape[0] != out:
            raise LoraFileError(
                f"{where} changes a {down.shape[1]}→{up.shape[0]} layer, but this checkpoint's is {fan_in}→{out} "
                "(a LoRA for another model?)."
            )
        flax_down = down.T  # [in, r]
    else:  # a conv: kernel [kh, kw, in, out]
        kh, kw, fan_in, _ = kernel_shape
        if down.ndim == 2 and (kh, kw) == (1, 1):
            down = down[:, :, None, None]
        if down.ndim != 4 or down.shape[1:] != (fan_in, kh, kw) or up.shape[0] != out:
            got = "x".join(map(str, down.shape[2:])) if down.ndim == 4 else "linear"
            raise LoraFileError(
                f"{where} changes a {got} conv {down.shape[1]}→{up.shape[0]}, but this checkpoint's is a "
                f"{kh}x{kw} conv {fan_in}→{out} (a LoRA for another model?)."
            )
        flax_down = down.transpose(2, 3, 1, 0).reshape(kh * kw * fan_in, rank)  # [kh·kw·in, r]
    if alpha is not None and alpha.size != 1:
        raise LoraFileError(f"{path.name} has an alpha for {_clip(module)} that is not one number.")
    for array, what in ((down, "down"), (up, "up"), (alpha, "alpha")):
        if array is not None and not np.isfinite(array).all():
            raise LoraFileError(f"{path.name} has NaN or infinite values in the {what} factor of {_clip(module)}.")
    if kind == "kohya":
        scale = (float(alpha.reshape(())) if alpha is not None else rank) / rank
    else:
        scale = _peft_scale(path, module, leaf[0], rank, alphas)
    return LoraLayer(
        down=np.ascontiguousarray(flax_down, np.float32),
        up=np.ascontiguousarray(up.T, np.float32),
        scale=scale,
        module=module,
    )


def _unreadable(path: Path, exc: BaseException) -> LoraFileError:
    return LoraFileError(f"{path.name} is not a readable safetensors file (truncated or corrupt: {_short(exc)}).")


def _clip(text: str, limit: int = 80) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(exc: BaseException) -> str:
    return _clip(str(exc), 100).rstrip(".") or exc.__class__.__name__


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.0f} kB"


__all__ = [
    "COMPONENTS",
    "LeafPath",
    "LoraDirectory",
    "LoraFile",
    "LoraFileError",
    "LoraLayer",
    "LoraTargets",
    "SafetensorsHeader",
    "a1111_hash",
    "addnet_hash",
    "load_lora",
    "load_lora_dir",
    "lora_targets",
    "read_header",
    "screen_lora_dir",
]
