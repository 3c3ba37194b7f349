"""A tiny, random-weight checkpoint with SDXL's architecture, built offline.

The real SDXL checkpoint is ~7 GB and needs a download; tests, CI and the CLI's ``make-tiny`` need something that
exercises exactly the same code path (the loader's, `loading.load_model`: two CLIP tokenizers and text encoders, the
text-time conditioned UNet, an 8x VAE, the Euler scheduler's config) but builds in seconds and runs a whole
generation in about a second on CPU. The weights are random, so the images are noise; what matters is that every
shape, config field and file name matches SDXL's Flax layout.

The checkpoint is written in the layout diffusers' and transformers' Flax ``save_pretrained`` wrote (config.json
with their fields, ``diffusion_flax_model.msgpack`` / ``flax_model.msgpack``, the tokenizers' files,
``scheduler_config.json``), so their loaders read it too; the parameter trees are the project's own modules'
(`device/nets/`), which are theirs. The tokenizers' vocabulary comes from a small byte-level BPE learned here from a
built-in corpus (same alphabet and file format as CLIP's), so ordinary prompts tokenize to a realistic number of
tokens and long prompts overflow the 77-token window, as they do with the real model.

Imported inside functions (heavy: JAX): `jax`, `numpy`, `flax`, `networks` and `device` (the networks) are imported
by the functions that build the weights; the folder's name and marker are read without JAX (service/info.py, which
the page imports).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import math
import os
import pathlib
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from .cache import default_cache_root

__all__ = ["GEOMETRY", "TINY_CHECKPOINT_NAME", "TinyGeometry", "make_tiny", "tiny_checkpoint", "train_bpe"]

# Subfolder of the cache directory; bump the suffix whenever the geometry or the corpus changes.
TINY_CHECKPOINT_NAME = "tiny-sdxl-v1"
# Written last into a finished checkpoint: its presence means "complete".
COMPLETE_MARKER = "tiny_checkpoint.json"

START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class TinyGeometry:
    """Sizes of the tiny checkpoint. Each field notes what the real SDXL base 1.0 uses."""

    # Tokenizers: CLIP's window of 77 tokens (same as SDXL).
    model_max_length: int = 77
    # BPE merges learned from the built-in corpus (SDXL: 48894); the vocab is 512 byte symbols + merges + 2 specials.
    bpe_merges: int = 1500

    # text_encoder (CLIPTextModel; SDXL: CLIP ViT-L, hidden 768, 12 layers, 12 heads, MLP 3072, quick_gelu).
    text_hidden_size: int = 32
    text_layers: int = 2
    text_heads: int = 2
    text_intermediate_size: int = 128
    text_hidden_act: str = "quick_gelu"

    # text_encoder_2 (CLIPTextModelWithProjection; SDXL: OpenCLIP bigG, hidden 1280, 32 layers, 20 heads,
    # MLP 5120, gelu, projection 1280). Kept a different width from text_encoder so a swapped encoder fails loudly.
    text_2_hidden_size: int = 64
    text_2_layers: int = 2
    text_2_heads: int = 4
    text_2_intermediate_size: int = 256
    text_2_hidden_act: str = "gelu"
    text_2_projection_dim: int = 64

    # UNet (SDXL: (320, 640, 1280) channels, (5, 10, 20) heads of 64, transformer depth (1, 2, 10), 2 resnets per
    # block, sample_size 128). Channels must be multiples of 32: SDXL's UNet hard-codes GroupNorm(32).
    unet_block_out_channels: tuple[int, ...] = (32, 64, 64)
    # Number of attention heads per block (diffusers' config calls this attention_head_dim); head size 16 here.
    unet_attention_heads: tuple[int, ...] = (2, 4, 4)
    # Transformer blocks per down/up block, SDXL's (1, 2, 10) scaled down; the mid block uses the last entry.
    unet_transformer_layers_per_block: tuple[int, ...] = (1, 1, 2)
    unet_layers_per_block: int = 2
    # Latent side length; 16 latents * 8 (VAE) = 128 px default image (SDXL: 128 -> 1024 px).
    unet_sample_size: int = 16
    # Sinusoidal size of each of the 6 micro-conditioning numbers (original size, crop, target size; SDXL: 256).
    addition_time_embed_dim: int = 8

    # VAE (SDXL: (128, 256, 512, 512), 2 resnets per block, 32 groups, scaling_factor 0.13025). Four blocks give
    # the same 8x latent downscale.
    vae_block_out_channels: tuple[int, ...] = (16, 32, 32, 32)
    vae_layers_per_block: int = 1
    vae_norm_num_groups: int = 8
    vae_latent_channels: int = 4
    vae_scaling_factor: float = 0.13025

    @property
    def cross_attention_dim(self) -> int:
        """The UNet attends to both encoders' hidden states, concatenated (SDXL: 768 + 1280 = 2048)."""
        return self.text_hidden_size + self.text_2_hidden_size

    @property
    def projection_class_embeddings_input_dim(self) -> int:
        """Pooled text embedding plus 6 time ids, each embedded sinusoidally (SDXL: 1280 + 6 * 256 = 2816)."""
        return self.text_2_projection_dim + 6 * self.addition_time_embed_dim

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae_block_out_channels) - 1)


GEOMETRY = TinyGeometry()

#: The releases whose `save_pretrained` wrote the layout the files follow (the version fields their configs carry).
LAYOUT_VERSIONS = {"diffusers": "0.39.0", "transformers": "4.57.6"}

#: model_index.json: the components and the (diffusers / transformers Flax) classes that wrote them.
MODEL_INDEX = {
    "_class_name": "FlaxStableDiffusionXLPipeline",
    "_diffusers_version": LAYOUT_VERSIONS["diffusers"],
    "scheduler": ["diffusers", "FlaxEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "FlaxCLIPTextModel"],
    "text_encoder_2": ["transformers", "FlaxCLIPTextModelWithProjection"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "CLIPTokenizer"],
    "unet": ["diffusers", "FlaxUNet2DConditionModel"],
    "vae": ["diffusers", "FlaxAutoencoderKL"],
}

# SDXL's scheduler (EulerDiscreteScheduler in the real repo's scheduler_config.json), in its Flax form.
SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "prediction_type": "epsilon",
    "timestep_spacing": "leading",
}

# Corpus for the BPE learner: common English words plus the vocabulary of image prompts. Each word counts once,
# so the learner ends up with most of these words as single tokens and anything else split into pieces.
CORPUS = """
the of and to in is was for on that with as by at from it his an were are which this be or has had not
but their first one its new after who they have her she two been other when there all also into during
time more can only would about up out over some such made many then most him than may these years where
three through world between used because before under people while well however year city known both
day part could later being life man same work back each like long large around down since state school
until another against own name high several end found number place still early series de area high
good great small little old big young right left light dark night morning evening sun moon star sky
water fire earth air wind rain snow ice cloud storm sea ocean river lake mountain hill forest tree
flower grass garden field road street house home room window door wall floor table chair bed book
car train ship boat plane bird dog cat horse fish lion tiger wolf bear fox dragon butterfly animal
woman girl boy child children family friend king queen knight warrior wizard witch robot alien
face eye eyes hair hand hands head body smile portrait person people figure character hero
red orange yellow green blue purple pink black white gray grey brown gold golden silver color colors
colorful bright soft warm cold beautiful pretty cute happy sad calm quiet loud strong fast slow
deep tall short wide open closed full empty clear clean wet dry fresh rich simple perfect ancient
modern future futuristic vintage retro classic natural wild magic magical mystical epic dramatic
photo photograph photography photographic photorealistic realistic cinematic film movie still shot
camera lens bokeh depth focus sharp blur blurry exposure lighting light lights shadow shadows glow
glowing neon volumetric studio ambient sunlight sunset sunrise golden hour render rendered rendering
anime manga cartoon comic illustration drawing sketch painting painted oil watercolor acrylic canvas
digital art artwork artist artstation concept fantasy science fiction cyberpunk steampunk surreal
abstract minimal minimalist detailed detail details intricate highly ultra quality resolution high
masterpiece best trending award winning professional stunning gorgeous elegant dynamic pose close
view wide angle aerial landscape cityscape skyline architecture building castle temple tower bridge
interior exterior background foreground scene composition style styled texture pattern shape
pixel voxel isometric low poly model sculpture statue clay paper origami glass metal wood stone
octane unreal engine ray tracing hdr uhd dslr macro telephoto portrait headshot fashion editorial
and with of in on at by a an the very much more most less few some any every all no not
is are was were be been being have has had do does did will would shall should can could may might
make makes made take takes took see sees saw look looks looking come comes came go goes went
walk walking run running stand standing sit sitting fly flying swim swimming hold holding wear
wearing dress dressed shirt jacket coat hat helmet armor sword shield crown cape mask glasses
spring summer autumn winter weather fog mist smoke dust sand desert jungle island beach coast valley
village town market cafe restaurant kitchen library museum station harbor farm park playground
music song dance dancer singer guitar piano violin drum painter writer scientist doctor soldier
pirate samurai ninja princess prince monster creature ghost spirit angel demon giant elf dwarf
apple banana cherry lemon bread cake coffee tea wine cup bottle plate bowl basket candle lamp
mirror clock phone computer screen keyboard bicycle motorcycle truck bus rocket spaceship planet
galaxy universe nebula crystal diamond jewel pearl feather leaf leaves branch root seed petal
smiling laughing crying sleeping dreaming thinking reading writing painting singing playing
beneath above behind beside inside outside across along among toward without within beyond
"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from the 256 byte values to printable unicode characters."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    byte_values = printable[:]
    code_points = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in byte_values:
            byte_values.append(byte)
            code_points.append(256 + extra)
            extra += 1
    return dict(zip(byte_values, (chr(code) for code in code_points), strict=True))


def _word_symbols(word: str, byte_encoder: dict[int, str]) -> tuple[str, ...]:
    """A word as CLIP's BPE sees it before merging: byte symbols, the last one marked with ``</w>``."""
    chars = [byte_encoder[byte] for byte in word.encode("utf-8")]
    return (*chars[:-1], chars[-1] + "</w>")


def train_bpe(words: Iterable[str], num_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Learn a CLIP-style byte-level BPE from ``words``; returns (vocab token -> id, merges in rank order).

    Deterministic: at each step the most frequent adjacent pair is merged, ties broken by the pair's text. Stops
    early when every word is a single symbol. The vocab follows CLIP's layout: 256 byte symbols, the same with
    ``</w>``, one token per merge, then ``<|startoftext|>`` and ``<|endoftext|>`` (so end-of-text has the largest id,
    which the Flax CLIP text model relies on to find the pooled token).
    """
    byte_encoder = bytes_to_unicode()
    word_counts = collections.Counter(word.lower() for word in words if word)
    segmented = {_word_symbols(word, byte_encoder): count for word, count in sorted(word_counts.items())}

    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pair_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        for symbols, count in segmented.items():
            for pair in itertools.pairwise(symbols):
                pair_counts[pair] += count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merges.append(best)
        merged_segmentation: dict[tuple[str, ...], int] = {}
        for symbols, count in segmented.items():
            merged: list[str] = []
            index = 0
            while index < len(symbols):
                if index + 1 < len(symbols) and (symbols[index], symbols[index + 1]) == best:
                    merged.append(symbols[index] + symbols[index + 1])
                    index += 2
                else:
                    merged.append(symbols[index])
                    index += 1
            key = tuple(merged)
            merged_segmentation[key] = merged_segmentation.get(key, 0) + count
        segmented = merged_segmentation

    tokens = list(byte_encoder.values())
    tokens += [token + "</w>" for token in tokens]
    tokens += ["".join(pair) for pair in merges]
    tokens += [START_TOKEN, END_TOKEN]
    vocab: dict[str, int] = {}
    for token in tokens:
        vocab.setdefault(token, len(vocab))
    return vocab, merges


def _random_params(init_weights: Callable[[Any], Any], seed: int, component: str) -> Any:
    """Random float32 parameters with exactly the tree ``init_weights(PRNGKey)`` would return.

    The tree (names and shapes) comes from the model's own ``init_weights`` traced with ``jax.eval_shape``, so
    nothing runs; running the real initialisers op by op costs ~20 s per model on a busy 2-core CPU, versus
    milliseconds here. Values follow Flax's default initialisers: ``kernel`` LeCun normal (std 1/sqrt(fan_in),
    truncated at 2 sigma), ``bias`` zeros, norm ``scale`` ones, ``embedding`` normal(0.02) as in CLIP. Each leaf
    draws from its own NumPy generator seeded by (seed, hash of component and path), so the bytes depend only on
    ``seed`` and the geometry.
    """
    import jax
    import numpy as np

    shapes = jax.eval_shape(init_weights, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    values = []
    for path, spec in leaves:
        leaf_name = "/".join(str(getattr(entry, "key", entry)) for entry in path)
        kind = leaf_name.rsplit("/", 1)[-1]
        generator = np.random.default_rng([seed, zlib.crc32(f"{component}/{leaf_name}".encode())])
        if kind == "bias":
            value = np.zeros(spec.shape, np.float32)
        elif kind == "scale":
            value = np.ones(spec.shape, np.float32)
        elif kind == "embedding":
            value = generator.standard_normal(spec.shape) * 0.02
        elif kind == "kernel":
            fan_in = math.prod(spec.shape[:-1])
            value = np.clip(generator.standard_normal(spec.shape), -2.0, 2.0) / math.sqrt(fan_in)
        else:
            raise ValueError(f"no initialiser for parameter {component}/{leaf_name}")
        values.append(np.asarray(value, dtype=np.float32))
    return jax.tree_util.tree_unflatten(treedef, values)


def _build_into(directory: pathlib.Path, *, seed: int, geometry: TinyGeometry) -> None:
    """Build every component and save the checkpoint into the (existing, empty) ``directory``."""
    from flax.serialization import to_bytes

    from .networks import FLAX_WEIGHTS

    vocab, merges = train_bpe(CORPUS.split(), geometry.bpe_merges)
    configs = _configs(geometry, vocab)
    _write_json(directory / "model_index.json", MODEL_INDEX)
    for name, pad in (("tokenizer", END_TOKEN), ("tokenizer_2", "!")):  # SDXL's pad tokens
        _write_tokenizer(directory / name, vocab, merges, pad, geometry.model_max_length)
    for name, module in _networks(configs).items():
        (directory / name).mkdir()
        _write_json(directory / name / "config.json", configs[name])
        params = _random_params(module.init_weights, seed, name)
        (directory / name / FLAX_WEIGHTS[name]).write_bytes(to_bytes(params))  # what save_pretrained writes
    (directory / "scheduler").mkdir()
    _write_json(directory / "scheduler" / "scheduler_config.json", configs["scheduler"])
    marker = {"name": TINY_CHECKPOINT_NAME, "seed": seed, "geometry": dataclasses.asdict(geometry)}
    (directory / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _write_json(path: pathlib.Path, value: dict) -> None:
    """JSON as diffusers' and transformers' `save_pretrained` write their configs: sorted keys, indent 2."""
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _write_tokenizer(
    directory: pathlib.Path, vocab: dict[str, int], merges: list[tuple[str, str]], pad: str, max_length: int
) -> None:
    """A CLIP tokenizer folder in the layout SDXL's repos ship (vocab.json, merges.txt, special_tokens_map.json,
    tokenizer_config.json), byte for byte what transformers 4.57's `CLIPTokenizer.save_pretrained` wrote for it."""
    directory.mkdir()
    (directory / "vocab.json").write_text(
        json.dumps(vocab, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    lines = ["#version: 0.2", *(f"{left} {right}" for left, right in merges)]
    (directory / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    marker = {"lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
    special = {
        "bos_token": {"content": START_TOKEN, **marker},
        "eos_token": {"content": END_TOKEN, **marker},
        "pad_token": pad,
        "unk_token": {"content": END_TOKEN, **marker},
    }
    (directory / "special_tokens_map.json").write_text(
        json.dumps(special, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    added = {}  # what transformers registered: a pad token of its own (CLIP-G's "!"), then the begin and end tokens
    if pad not in (START_TOKEN, END_TOKEN):
        added[str(vocab[pad])] = {"content": pad, **marker, "normalized": False}
    for token in (START_TOKEN, END_TOKEN):
        added[str(vocab[token])] = {"content": token, **marker}
    config = {
        "added_tokens_decoder": {index: {**entry, "special": True} for index, entry in added.items()},
        "bos_token": START_TOKEN,
        "clean_up_tokenization_spaces": False,
        "eos_token": END_TOKEN,
        "errors": "replace",
        "extra_special_tokens": {},
        "model_max_length": max_length,
        "pad_token": pad,
        "tokenizer_class": "CLIPTokenizer",
        "unk_token": END_TOKEN,
    }
    text = json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


def _configs(geometry: TinyGeometry, vocab: dict) -> dict[str, dict]:
    """Each component's config.json (scheduler: scheduler_config.json) at the tiny widths, with the fields and
    values diffusers' and transformers' `save_pretrained` wrote for their Flax classes (LAYOUT_VERSIONS')."""
    return {
        **_text_configs(geometry, vocab),
        "unet": _unet_config(geometry),
        "vae": _vae_config(geometry),
        "scheduler": _scheduler_config(),
    }


def _text_configs(geometry: TinyGeometry, vocab: dict) -> dict[str, dict]:
    """The two CLIP text encoders' config.json, as transformers wrote them: CLIP-L's and CLIP-G's (with its
    projection), sharing the vocabulary and the special tokens."""
    text_common = {
        "attention_dropout": 0.0,
        "bos_token_id": vocab[START_TOKEN],
        "eos_token_id": vocab[END_TOKEN],
        "initializer_factor": 1.0,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": geometry.model_max_length,
        "model_type": "clip_text_model",
        "pad_token_id": vocab[END_TOKEN],
        "transformers_version": LAYOUT_VERSIONS["transformers"],
        "vocab_size": len(vocab),
    }
    return {
        "text_encoder": {
            **text_common,
            "architectures": ["CLIPTextModel"],
            "hidden_act": geometry.text_hidden_act,
            "hidden_size": geometry.text_hidden_size,
            "intermediate_size": geometry.text_intermediate_size,
            "num_attention_heads": geometry.text_heads,
            "num_hidden_layers": geometry.text_layers,
            "projection_dim": geometry.text_hidden_size,
        },
        "text_encoder_2": {
            **text_common,
            "architectures": ["CLIPTextModelWithProjection"],
            "hidden_act": geometry.text_2_hidden_act,
            "hidden_size": geometry.text_2_hidden_size,
            "intermediate_size": geometry.text_2_intermediate_size,
            "num_attention_heads": geometry.text_2_heads,
            "num_hidden_layers": geometry.text_2_layers,
            "projection_dim": geometry.text_2_projection_dim,
        },
    }


def _unet_config(geometry: TinyGeometry) -> dict:
    """The UNet's config.json, as diffusers wrote it for its Flax UNet: SDXL's blocks at the tiny widths."""
    return {
        "_class_name": "FlaxUNet2DConditionModel",
        "_diffusers_version": LAYOUT_VERSIONS["diffusers"],
        "addition_embed_type": "text_time",
        "addition_embed_type_num_heads": 64,
        "addition_time_embed_dim": geometry.addition_time_embed_dim,
        "attention_head_dim": list(geometry.unet_attention_heads),
        "block_out_channels": list(geometry.unet_block_out_channels),
        "cross_attention_dim": geometry.cross_attention_dim,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
        "dropout": 0.0,
        "flip_sin_to_cos": True,
        "freq_shift": 0,
        "in_channels": geometry.vae_latent_channels,
        "layers_per_block": geometry.unet_layers_per_block,
        "mid_block_type": "UNetMidBlock2DCrossAttn",
        "num_attention_heads": None,
        "only_cross_attention": False,
        "out_channels": geometry.vae_latent_channels,
        "projection_class_embeddings_input_dim": geometry.projection_class_embeddings_input_dim,
        "sample_size": geometry.unet_sample_size,
        "split_head_dim": False,
        "transformer_layers_per_block": list(geometry.unet_transformer_layers_per_block),
        "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
        "use_linear_projection": True,
        "use_memory_efficient_attention": False,
    }


def _vae_config(geometry: TinyGeometry) -> dict:
    """The VAE's config.json, as diffusers wrote it for its Flax AutoencoderKL."""
    blocks = len(geometry.vae_block_out_channels)
    return {
        "_class_name": "FlaxAutoencoderKL",
        "_diffusers_version": LAYOUT_VERSIONS["diffusers"],
        "act_fn": "silu",
        "block_out_channels": list(geometry.vae_block_out_channels),
        "down_block_types": ["DownEncoderBlock2D"] * blocks,
        "in_channels": 3,
        "latent_channels": geometry.vae_latent_channels,
        "layers_per_block": geometry.vae_layers_per_block,
        "norm_num_groups": geometry.vae_norm_num_groups,
        "out_channels": 3,
        "sample_size": geometry.unet_sample_size * geometry.vae_scale_factor,
        "scaling_factor": geometry.vae_scaling_factor,
        "up_block_types": ["UpDecoderBlock2D"] * blocks,
    }


def _scheduler_config() -> dict:
    """scheduler_config.json: SDXL's Euler scheduler settings (SCHEDULER_CONFIG), as diffusers wrote them."""
    return {
        "_class_name": "FlaxEulerDiscreteScheduler",
        "_diffusers_version": LAYOUT_VERSIONS["diffusers"],
        **SCHEDULER_CONFIG,
        "trained_betas": None,
    }


def _networks(configs: dict[str, dict]) -> dict[str, Any]:
    """The project's modules (no weights) for the configs: the trees the random weights are drawn for."""
    from ..device.nets.clip import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
    from ..device.nets.unet import UNet2DConditionModel, UNetConfig
    from ..device.nets.vae import AutoencoderKL, VAEConfig

    return {
        "text_encoder": CLIPTextModel(CLIPTextConfig.from_dict(configs["text_encoder"])),
        "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig.from_dict(configs["text_encoder_2"])),
        "unet": UNet2DConditionModel(UNetConfig.from_dict(configs["unet"])),
        "vae": AutoencoderKL(VAEConfig.from_dict(configs["vae"])),
    }


def _is_complete(directory: pathlib.Path) -> bool:
    return (directory / COMPLETE_MARKER).is_file()


def _staging_dir(target: pathlib.Path) -> pathlib.Path:
    """An empty directory beside ``target`` (same filesystem, so the final rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))


def _build_staged(target: pathlib.Path, *, seed: int, geometry: TinyGeometry) -> pathlib.Path:
    staging = _staging_dir(target)
    try:
        _build_into(staging, seed=seed, geometry=geometry)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def make_tiny(directory: str | os.PathLike, *, seed: int = 0, geometry: TinyGeometry = GEOMETRY) -> pathlib.Path:
    """Write a tiny random SDXL checkpoint (diffusers Flax layout) to ``directory`` and return its path.

    Loads with `loading.load_model` (and with diffusers' Flax pipeline's ``from_pretrained``). The same ``seed`` gives
    byte-identical weights. Built in a temporary directory beside the target and renamed into place, so a
    crash never leaves a half-written checkpoint; an existing ``directory`` is replaced.
    """
    target = pathlib.Path(directory).absolute()
    staging = _build_staged(target, seed=seed, geometry=geometry)
    try:
        os.replace(staging, target)  # atomic when target is absent or an empty directory
    except OSError:
        # target is a non-empty directory: swap it out, move the new one in, then delete the old one.
        retired = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, retired / "checkpoint")
        os.replace(staging, target)
        shutil.rmtree(retired, ignore_errors=True)
    return target


def tiny_checkpoint(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Path of the cached tiny checkpoint (seed 0), building it on first use.

    Safe when several processes call it at once: each builds into its own temporary directory and renames it into
    place; whoever loses the race discards its copy and uses the winner's.
    """
    target = (pathlib.Path(cache_dir) if cache_dir is not None else default_cache_root()) / TINY_CHECKPOINT_NAME
    target = target.absolute()
    if _is_complete(target):
        return target
    staging = _build_staged(target, seed=0, geometry=GEOMETRY)
    try:
        os.replace(staging, target)
        return target
    except OSError:
        if not _is_complete(target):
            # Something that is not one of our finished checkpoints is in the way; move it aside and retry once.
            retired = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            with contextlib.suppress(FileNotFoundError):
                os.replace(target, retired / "checkpoint")
            with contextlib.suppress(OSError):
                os.replace(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # no-op when it was renamed into place
    if not _is_complete(target):
        raise RuntimeError(f"could not place the tiny checkpoint at {target}")
    return target
