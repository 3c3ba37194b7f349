"""`--ip-adapter`: IP-Adapter files as h94/IP-Adapter publishes them, and the image encoder each one needs.

    --ip-adapter h94/IP-Adapter:sdxl_models/ip-adapter_sdxl.safetensors        # REPO:FILE (the Hub)
    --ip-adapter plus=./adapters/ip-adapter-plus_sdxl_vit-h.safetensors         # NAME=PATH (a local file)

A file holds `image_proj.*` (the projection: `nets/image_projection.py`, its kind read off its keys) and
`ip_adapter.{k}.to_k_ip/to_v_ip.weight` for every cross-attention of the UNet, k = 1, 3, 5, ... in the order
diffusers' `_convert_ip_adapter_attn_to_diffusers` walks `unet.attn_processors` (down blocks, up blocks, then the
middle block; each transformer layer's attn1 counted too). `.safetensors` holds them flat; `.bin` (torch.save of
{"image_proj": {...}, "ip_adapter": {...}}) is read without torch by the upscalers' restricted unpickler.

The image encoder is the `image_encoder/` folder beside the file (h94's layout: `sdxl_models/image_encoder` is
OpenCLIP ViT-bigG, `models/image_encoder` ViT-H), a transformers `CLIPVisionModelWithProjection`. A file that cannot
serve SDXL is refused in one sentence: an SD 1.5 adapter (its keys are 768 wide), a FaceID one (it needs
insightface's face embedding, which this server does not compute), one whose encoder is not the one beside it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax.traverse_util import unflatten_dict
from safetensors.numpy import load_file

from ..contract.errors import CheckpointError, InvalidInput, ModelLoadError
from ..contract.request import adapter_name
from ..device.nets.clip_vision import CLIPVisionConfig, CLIPVisionModelWithProjection
from ..device.nets.image_projection import ImageProjectionConfig
from . import convert
from .controlnet_loading import split_spec
from .hub import folder_or_snapshot, hub_file
from .loading import cast_params
from .upscaler_loading import read_pth

logger = logging.getLogger(__name__)

ENCODER_FOLDER = "image_encoder"
ENCODER_PATTERNS = ("config.json", "*.safetensors")
SUFFIXES = (".safetensors", ".bin")


@dataclasses.dataclass(frozen=True)
class ImageEncoderWeights:
    """An image encoder: its module, weights (the engine's dtype) and where it came from (logged only)."""

    module: Any  # nets/clip_vision.CLIPVisionModelWithProjection
    params: dict
    source: str


@dataclasses.dataclass(frozen=True)
class IPAdapterWeights:
    """One loaded adapter: its name (as requests and `parameters` say it), projection and per-layer kernels."""

    name: str
    projection: Any  # nets/image_projection.ImageProjectionConfig
    params: dict  # {"image_proj": tree, "layers": {attn2 path: {"to_k_ip": [C, D], "to_v_ip": [C, D]}}}
    encoder: ImageEncoderWeights
    source: str  # the path or Hub id (logged at start-up only, never shown to users)

    @property
    def a1111_module(self) -> str:
        """sd-webui-controlnet's preprocessor for it: OpenCLIP ViT-bigG's (1664 wide) or ViT-H's encoder."""
        wide = self.encoder.module.config.hidden_size
        bigg = wide == 1664 or (wide not in (1280, 1664) and not self.projection.reads_hidden_states)
        return "ip-adapter_clip_sdxl" if bigg else "ip-adapter_clip_sdxl_plus_vith"


def cross_attention_paths(unet_config) -> list[str]:
    """The UNet's attn2 layers (the project's module paths), in diffusers' `attn_processors` order."""
    config = unet_config
    blocks = len(config.down_block_types)
    depths = tuple(config.transformer_layers_per_block)

    def block(prefix: str, index: int, attentions: int, depth: int) -> list[str]:
        return [
            f"{prefix}_{index}/attentions_{a}/transformer_blocks_{t}/attn2"
            for a in range(attentions)
            for t in range(depth)
        ]

    paths = []
    for i, kind in enumerate(config.down_block_types):
        if kind.startswith("CrossAttn"):
            paths += block("down_blocks", i, config.layers_per_block, depths[i])
    for i, kind in enumerate(config.up_block_types):
        if kind.startswith("CrossAttn"):
            paths += block("up_blocks", i, config.layers_per_block + 1, depths[::-1][i])
    paths += [f"mid_block/attentions_0/transformer_blocks_{t}/attn2" for t in range(depths[blocks - 1])]
    return paths


def split_adapter_spec(spec: str) -> tuple[str, str, str | None]:
    """`[NAME=]PATH_OR_REPO[:FILE]` -> (name, source, the file in the repo or None); the name is the one requests
    use (`contract/request.adapter_name`: NAME, else the file's stem)."""
    _, source = split_spec(spec)
    repo, sep, file = source.partition(":")
    if sep and not Path(source).exists() and "/" in repo and file:
        return adapter_name(spec), repo, file
    return adapter_name(spec), source, None


def read_adapter_file(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """{"image_proj": {name: array}, "ip_adapter": {name: array}} from a `.safetensors` or a torch `.bin`."""
    if path.suffix == ".safetensors":
        try:
            flat = load_file(str(path))
        except Exception as error:
            raise CheckpointError(f"it is not a readable .safetensors file ({type(error).__name__})") from None
        state: dict[str, dict] = {"image_proj": {}, "ip_adapter": {}}
        for key, value in flat.items():
            top, _, rest = key.partition(".")
            if top not in state:
                raise CheckpointError(f"its tensor {key} is neither image_proj.* nor ip_adapter.*: not an IP-Adapter")
            state[top][rest] = value
        return state
    if path.suffix != ".bin":
        raise CheckpointError(f"it is a {path.suffix or 'suffixless'} file; IP-Adapters come as .safetensors or .bin")
    try:
        state = read_pth(path)
    except InvalidInput as exc:
        raise CheckpointError(str(exc).rstrip(".")) from None
    if not (isinstance(state, dict) and isinstance(state.get("image_proj"), dict) and "ip_adapter" in state):
        raise CheckpointError("it holds no {image_proj, ip_adapter} state dicts: not an IP-Adapter")
    return {"image_proj": dict(state["image_proj"]), "ip_adapter": dict(state["ip_adapter"])}


def projection_config(image_proj: dict[str, np.ndarray], cross_attention_dim: int):
    """The projection's config from its tensors' names and shapes; CheckpointError for kinds not served."""
    if "latents" in image_proj:  # h94's Resampler (Plus, Plus Face)
        latents = image_proj["latents"]  # [1, queries, width]
        width = latents.shape[2]
        depth = len({key.split(".")[1] for key in image_proj if key.startswith("layers.")})
        return ImageProjectionConfig(
            kind="plus",
            embed_dim=image_proj["proj_in.weight"].shape[1],
            cross_attention_dim=image_proj["proj_out.weight"].shape[0],
            tokens=latents.shape[1],
            width=width,
            heads=image_proj["layers.0.0.to_q.weight"].shape[0] // 64,
            depth=depth,
            ff_mult=image_proj["layers.0.1.1.weight"].shape[0] // width,
        )
    if "proj.weight" in image_proj and "norm.weight" in image_proj:  # ImageProjModel
        width = image_proj["norm.weight"].shape[0]
        return ImageProjectionConfig(
            kind="plain",
            embed_dim=image_proj["proj.weight"].shape[1],
            cross_attention_dim=width,
            tokens=image_proj["proj.weight"].shape[0] // width,
        )
    if any(key.startswith(("proj.0", "perceiver_resampler", "norm.")) for key in image_proj):
        raise CheckpointError(
            "it is a FaceID adapter, which needs insightface's face embedding; this server encodes images with CLIP "
            "only (use ip-adapter-plus-face_sdxl_vit-h for faces)"
        )
    raise CheckpointError("its image_proj is neither IP-Adapter's projection nor its Resampler")


def _projection_tree(image_proj: dict[str, np.ndarray], kind: str) -> dict:
    """h94's tensor names -> the Flax tree of `nets/image_projection.py` (PyTorch [out, in] kernels transposed)."""
    flat = {}
    for key, value in image_proj.items():
        parts = key.split(".")
        if kind == "plus" and parts[0] == "layers":  # layers.{i}.{0|1}.rest -> layers_{i}/{0|1}/rest
            parts = [f"layers_{parts[1]}", *parts[2:]]
        last = parts[-1]
        if last == "weight" and value.ndim == 2:
            flat[(*parts[:-1], "kernel")] = value.T
        elif last == "weight":  # a LayerNorm's
            flat[(*parts[:-1], "scale")] = value
        else:  # biases, the Resampler's latents
            flat[tuple(parts)] = value
    return unflatten_dict(flat)


def _layer_tree(ip_adapter: dict[str, np.ndarray], paths: list[str], cross_attention_dim: int) -> dict:
    """`ip_adapter.{k}.to_k_ip.weight` -> {attn2 path: {"to_k_ip": [C, D], "to_v_ip": [C, D]}}."""
    numbers = sorted({int(key.split(".")[0]) for key in ip_adapter if key.split(".")[0].isdigit()})
    if any(".to_k_lora" in key or ".to_q_lora" in key for key in ip_adapter):
        raise CheckpointError("it is a FaceID adapter (LoRA layers), which needs insightface's face embedding")
    if len(numbers) != len(paths):
        raise CheckpointError(
            f"it has {len(numbers)} cross-attention layers, SDXL's UNet {len(paths)}: "
            + ("an SD 1.5 adapter" if len(numbers) == 16 else "not an SDXL IP-Adapter")
        )
    tree = {}
    for index, path in enumerate(paths):
        k = 2 * index + 1
        try:
            to_k, to_v = ip_adapter[f"{k}.to_k_ip.weight"], ip_adapter[f"{k}.to_v_ip.weight"]
        except KeyError:
            raise CheckpointError(f"it lacks ip_adapter.{k}.to_k_ip/to_v_ip: not an SDXL IP-Adapter") from None
        if to_k.shape[1] != cross_attention_dim:
            raise CheckpointError(
                f"its image keys read {to_k.shape[1]}-wide tokens, SDXL's UNet {cross_attention_dim}-wide: "
                + ("an SD 1.5 adapter" if to_k.shape[1] == 768 else "not an SDXL IP-Adapter")
            )
        tree[path] = {"to_k_ip": to_k.T, "to_v_ip": to_v.T}
    return tree


def load_image_encoder(directory: Path, dtype: str, *, use_cache: bool = True) -> ImageEncoderWeights:
    """The `CLIPVisionModelWithProjection` in `directory` (config.json + safetensors), converted without torch."""
    try:
        config = json.loads((directory / "config.json").read_text())
        module = CLIPVisionModelWithProjection(CLIPVisionConfig.from_dict(config), dtype=getattr(jnp, dtype))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"its image encoder's config.json cannot be read ({exc.__class__.__name__})") from None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError("its image encoder folder has no .safetensors weights (only safetensors are read)")
    converted = convert.load_converted(
        ([f for f in files if "fp16" not in f.name] or files)[:1],  # the full-precision file where there are two
        module.init_weights,
        component="image_encoder",
        dtype=dtype,
        config=dataclasses.asdict(module.config),
        model_prefix="",
        use_cache=use_cache,
    )
    return ImageEncoderWeights(module, converted.params, str(directory))


def _adapter_file(source: str, file: str | None) -> Path:
    if file is not None:
        try:
            return Path(hub_file(source, file))
        except ModelLoadError as exc:
            raise CheckpointError(str(exc).replace("--unet", "--ip-adapter").rstrip(".")) from None
    path = Path(source).expanduser()
    if not path.is_file():
        raise CheckpointError("no such file (pass a .safetensors or .bin file, or REPO:FILE on the Hub)")
    return path


def _encoder_folder(source: str, file: str | None, path: Path) -> Path:
    if file is None:
        return path.parent / ENCODER_FOLDER
    folder = str(Path(file).parent / ENCODER_FOLDER)
    snapshot = folder_or_snapshot(source, tuple(f"{folder}/{p}" for p in ENCODER_PATTERNS), "image encoder")
    return snapshot / folder


def load_ip_adapter(spec: str, unet_config, dtype: str, *, encoders: dict | None = None) -> IPAdapterWeights:
    """One `--ip-adapter` value -> IPAdapterWeights; CheckpointError (one sentence naming it) when it cannot serve.
    `encoders`: image encoders already loaded, by folder (adapters beside one encoder share it)."""
    name, source, file = split_adapter_spec(spec)
    encoders = {} if encoders is None else encoders
    try:
        path = _adapter_file(source, file)
        if path.suffix not in SUFFIXES:
            raise CheckpointError(f"it is a {path.suffix or 'suffixless'} file; IP-Adapters are .safetensors or .bin")
        state = read_adapter_file(path)
        paths = cross_attention_paths(unet_config)
        layers = _layer_tree(state["ip_adapter"], paths, unet_config.cross_attention_dim)
        projection = projection_config(state["image_proj"], unet_config.cross_attention_dim)
        if projection.cross_attention_dim != unet_config.cross_attention_dim:
            raise CheckpointError(
                f"its image tokens are {projection.cross_attention_dim} wide, SDXL's UNet reads "
                f"{unet_config.cross_attention_dim}: not an adapter for this model"
            )
        folder = _encoder_folder(source, file, path)
        if folder not in encoders:
            if not (folder / "config.json").is_file():
                raise CheckpointError(f"it has no {ENCODER_FOLDER}/ folder beside it (h94's layout): no image encoder")
            encoders[folder] = load_image_encoder(folder, dtype)
        encoder = encoders[folder]
        _check_encoder(projection, encoder.module.config)
    except CheckpointError as exc:
        raise CheckpointError(f"IP-Adapter {name!r} was not loaded: {str(exc).rstrip('.')}.") from None
    params = cast_params(
        {"image_proj": _projection_tree(state["image_proj"], projection.kind), "layers": layers}, dtype
    )
    return IPAdapterWeights(name, projection, params, encoder, source)


def _check_encoder(projection, encoder_config) -> None:
    """The projection reads the encoder's output: its projection_dim (plain) or hidden_size (Plus)."""
    wanted = encoder_config.hidden_size if projection.reads_hidden_states else encoder_config.projection_dim
    if projection.embed_dim != wanted:
        names = {1280: "ViT-bigG", 1024: "ViT-H", 1664: "ViT-bigG"}
        needs = names.get(projection.embed_dim, f"a {projection.embed_dim}-wide")
        has = names.get(wanted, f"a {wanted}-wide")
        raise CheckpointError(f"it needs {needs} image embeddings and the encoder beside it gives {has}")


def load_ip_adapters(specs, unet_config, dtype: str) -> list[IPAdapterWeights]:
    """Every `--ip-adapter`, in order; CheckpointError for the first that cannot serve (a server asked for an image
    prompt it cannot give does not start: its page would offer what it cannot do)."""
    loaded, encoders = [], {}
    for spec in specs:
        weights = load_ip_adapter(spec, unet_config, dtype, encoders=encoders)
        if weights.name in {w.name for w in loaded}:
            raise CheckpointError(f"IP-Adapter {weights.name!r} is given twice; name one NAME=PATH.")
        logger.info(
            "IP-Adapter %r: %s projection, %d tokens per image, encoder %s",
            weights.name,
            weights.projection.kind,
            weights.projection.tokens,
            Path(weights.encoder.source).name,
        )
        loaded.append(weights)
    if len({id(w.encoder) for w in loaded}) > 1:
        raise CheckpointError(
            "The IP-Adapters given need different image encoders (ViT-H and ViT-bigG); serve adapters of one encoder."
        )
    return loaded
