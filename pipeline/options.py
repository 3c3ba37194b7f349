"""Every option of the engine, declared once: its flag, environment variable, type, default, help, which programs
take it and whether changing it compiles other programs.

The app (`app.py`, which adds the server's own options from `web/options.py`), `python -m pipeline generate`,
`... precompile`, `... make-tiny`, `... serve` (its own in `service/command_line.py`) and `python -m bench` build
their parsers from these tables, and docs/options.md's table is printed from them (`python -m web.options`), so the
next option is one line here. The environment variable is read here, when a parser is built, for whichever program
takes the option; the flag wins. An option that sets an engine setting takes its default from `EngineConfig` (or
the request field's, `fields.FIELDS`), the one place it is declared. Kept free of JAX.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass

from .cluster.join_options import ClusterOptions
from .config import (
    DTYPES,
    EMPHASIS_MODES,
    MAX_PROMPT_WINDOWS,
    MAX_TEXT_CACHE,
    QUANTIZE_MODES,
    SDXL_BASE,
    SDXL_BASE_FLAX_REVISION,
    SDXL_SHAPE,
    SHAPE_DEFAULTS,
    TINY_MODEL,
    EngineConfig,
)
from .contract.controlnet_units import MAX_CONTROLNETS
from .contract.errors import InvalidInput
from .contract.fields import FIELD, FIELDS, Field
from .contract.image_prompts import MAX_IP_SLOTS
from .contract.presets import PRESET_NAMES
from .contract.request import MAX_LORAS
from .contract.sampler_names import PREDICTION_TYPES, SAMPLER_NAMES, SPACINGS, sampler_id, sampler_label
from .contract.sizes import default_sizes
from .contract.xyz_plot import MAX_CELLS
from .device.cores import ATTENTIONS

#: The programs that take options: the app, `python -m pipeline generate` (the CLI), `... precompile`, the bench,
#: `... serve` (the engine service: the app's engine options and its own) and `... make-tiny`.
APP, CLI, PRECOMPILE, BENCH, SERVE, MAKE_TINY = "app", "cli", "precompile", "bench", "serve", "make-tiny"
BOTH = frozenset({APP, CLI})
#: Options that shape the compiled programs, taken by every program that loads the model.
ENGINE = frozenset({APP, CLI, PRECOMPILE, BENCH})
#: The names docs/options.md's table uses for the programs, in its order (another program goes by its own name).
PROGRAM_NAMES = {
    APP: "app",
    SERVE: "serve",
    CLI: "CLI",
    PRECOMPILE: "precompile",
    BENCH: "bench",
    MAKE_TINY: "make-tiny",
}
#: Truthy spellings of a switch's environment variable (SDXL_NO_CFG=1).
TRUE_WORDS = ("1", "true", "yes", "on")
#: The multi-host group's title in --help.
CLUSTER_GROUP = "multi-host (jax.distributed)"


def _bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` (to `high`); the error names the allowed range."""

    def parse(text: str) -> int:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number; got {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {value}")
        return value

    parse.__name__ = "int"
    parse.values = f"{low}–{high}" if high is not None else f"whole number ≥ {low}"  # the options table's words
    return parse


def positive_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive; got {value:g}")
    return value


positive_float.__name__ = "float"


def sampler_argument(text: str) -> str:
    """argparse type of --sampler: A1111's names (any case) or the engine's ids, kept as A1111's name."""
    try:
        return sampler_label(sampler_id(text))
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


sampler_argument.__name__ = "sampler"


@dataclass(frozen=True)
class Option:
    """One option: its flag, where it applies, and how it is read."""

    flag: str  # the long flag, e.g. "--model" (a name without "-": a positional); the dest is it with "_" for "-"
    help: str  # one line for --help and the README; the env variable and default are appended
    env: str | None = None  # environment variable read when the flag is absent (None: flag only)
    type: Callable[[str], object] | None = None  # argparse type (None: the text as given)
    default: object = None  # value when neither flag nor env is set; None = resolved later (per model/platform)
    default_text: str = ""  # what --help says about a default resolved later, e.g. "1024, 128 for tiny"
    choices: tuple[str, ...] = ()  # allowed values (checked for the env variable too)
    kind: str = "value"  # "value", "switch" (store_true; env: 1/true/yes) or "append" (repeatable)
    env_list: bool = False  # "append": the environment variable holds a comma-separated list (False: one value)
    programs: frozenset[str] = BOTH  # which programs take it: APP, CLI, PRECOMPILE, BENCH
    recompiles: bool = False  # True: another value compiles other programs (at start-up; a request never does)
    metavar: str | None = None  # placeholder in --help
    required: bool = False  # the CLI's --prompt and --out
    group: str = ""  # an argparse group title ("" = the main list)
    aliases: tuple[str, ...] = ()  # older spellings of the flag, still taken (the flag is the one documented)
    env_aliases: tuple[str, ...] = ()  # older names of the environment variable, read when `env` is unset

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def positional(self) -> bool:
        """A name without "-" (make-tiny's folder): given without a flag, always required."""
        return not self.flag.startswith("-")

    def note(self, default: object = None) -> str:
        """The bracketed note --help appends: env variable and default (`default`: a program's own, if given)."""
        if self.kind == "append":  # no default: the flags, else the environment variable's values
            return f" [{self.env}: {self.env_values_text}]" if self.env else ""
        value = self.default if default is None else default
        default = (self.default_text if default is None else "") or ("" if _unset(value) else str(value))
        env = " or ".join((self.env, *self.env_aliases)) if self.env else ""
        parts = [env] + ([f"default {default}"] if default else [])
        text = "; ".join(p for p in parts if p)
        return f" [{text}]" if text else ""

    @property
    def env_values_text(self) -> str:
        """What a repeatable option's environment variable holds: "comma-separated", "one USER:PASSWORD"."""
        return "comma-separated" if self.env_list else f"one {self.metavar or 'value'}"


port_number = _bounded_int(1, 65535)
_STEPS = _bounded_int(int(FIELD["steps"].low), int(FIELD["steps"].high))
at_least_one = _bounded_int(1)
non_negative = _bounded_int(0)


def config_default(name: str, settings: type = EngineConfig):
    """The engine's own default for setting `name` (its `EngineConfig` field, or the field of another `settings`
    dataclass): an option that sets a setting takes its default from there, so the default is declared once."""
    return settings.__dataclass_fields__[name].default


def _shape_text(index: int) -> str:
    """--height's, --width's or --steps' default as --help says it: "1024, 128 for tiny" (config.shape_defaults)."""
    return f"{SDXL_SHAPE[index]}, {SHAPE_DEFAULTS[TINY_MODEL][index]} for {TINY_MODEL}"


def _number_or_text(value) -> str:
    """A default as --help writes it: 0.55, 1, Latent."""
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def request_option(row: Field) -> Option:
    """The CLI flag of one request field: its help, type and default from the table (`fields.FIELDS`)."""
    cli = frozenset({CLI})
    if row.kind == "loras":
        return Option(
            row.flag,
            f"apply a LoRA of --lora-dir: NAME:WEIGHT or NAME:TE_WEIGHT:UNET_WEIGHT (repeat, up to "
            f"{MAX_LORAS}; or <lora:NAME:WEIGHT> in --prompt)",
            kind="append",
            metavar="NAME:WEIGHT",
            programs=cli,
        )
    if row.kind == "file":
        return Option(row.flag, row.help, metavar="FILE", programs=cli, aliases=row.aliases)
    if row.kind == "controls":  # one per ControlNet unit; --control, --control-weight, ... apply to the same unit
        return Option(
            row.flag,
            "a control map (or picture, with --control-preprocessor canny) for a --controlnet "
            "(repeat for a second one)",
            kind="append",
            metavar="FILE",
            programs=cli,
        )
    if row.kind == "image_prompts":  # one per image prompt; --ip-scale, --ip-start, ... apply to the same one
        return Option(
            row.flag,
            "a picture to prompt with through an --ip-adapter (repeat for another, up to --ip-slots)",
            kind="append",
            metavar="FILE",
            programs=cli,
        )
    if row.kind == "seed":
        return Option(row.flag, f"{row.help}; or 'random'", default=str(row.default), programs=cli)
    if not row.plain:  # text
        return Option(row.flag, row.help, default=row.default, required=row.name == "prompt", programs=cli)
    later = bool(row.rule or row.needs)  # the server's default, or a picture's
    kind = {"int": int, "float": float}.get(row.kind, str)
    open_choice = row.name == "hires_upscaler"  # also --upscaler-dir's models: the engine checks it, in one sentence
    return Option(
        row.flag,
        f"{row.help}; {row.values_text}" + (" or a --upscaler-dir model" if open_choice else ""),
        type=kind,
        default=None if later else row.default,
        default_text=_number_or_text(row.default) if later else "",
        choices=() if open_choice else (*row.choices, *(alias for alias, _ in row.choice_aliases)),
        programs=cli,
    )


#: The CLI's ControlNet unit settings, the i-th of each going with the i-th --control-image.
CONTROL_OPTIONS = (
    Option(
        "--control",
        "which --controlnet the control image is for (by name; needed when several are loaded)",
        kind="append",
        metavar="NAME",
        programs=frozenset({CLI}),
    ),
    Option(
        "--control-weight",
        "the control's weight, 0..2 (A1111's Control Weight)",
        kind="append",
        type=float,
        metavar="W",
        programs=frozenset({CLI}),
    ),
    Option(
        "--control-start",
        "fraction of the steps where the control starts acting, 0..1",
        kind="append",
        type=float,
        metavar="F",
        programs=frozenset({CLI}),
    ),
    Option(
        "--control-end",
        "fraction of the steps where it stops, 0..1",
        kind="append",
        type=float,
        metavar="F",
        programs=frozenset({CLI}),
    ),
    Option(
        "--control-preprocessor",
        "none (the image is the map), canny (edges of the picture) or tile (a blurred copy, A1111's tile_resample)",
        kind="append",
        metavar="NAME",
        programs=frozenset({CLI}),
    ),
    Option(
        "--control-type",
        "a union ControlNet's (ProMax) condition type: openpose, depth, softedge, scribble, canny, lineart, mlsd, "
        "normal, segment, tile, repaint, ...",
        kind="append",
        metavar="TYPE",
        programs=frozenset({CLI}),
    ),
)

#: The CLI's image prompt settings, the i-th of each going with the i-th --ip-image.
IMAGE_PROMPT_OPTIONS = (
    Option(
        "--ip-image-adapter",
        "which --ip-adapter the image prompt is for (by name; needed when several are loaded)",
        kind="append",
        metavar="NAME",
        programs=frozenset({CLI}),
    ),
    Option(
        "--ip-scale",
        "the image prompt's scale, 0..2 (default 0.6)",
        kind="append",
        metavar="S",
        programs=frozenset({CLI}),
    ),
    Option(
        "--ip-start",
        "fraction of the steps where the image prompt starts acting, 0..1",
        kind="append",
        metavar="F",
        programs=frozenset({CLI}),
    ),
    Option(
        "--ip-end", "fraction of the steps where it stops, 0..1", kind="append", metavar="F", programs=frozenset({CLI})
    ),
)

#: The engine's options (and the CLI's request and the multi-host flags). Order is the order of --help.
#: The X/Y/Z plot (pipeline/contract/xyz_plot.py): the CLI's axes, and the most cells a plot may have (the app's too).
XYZ_OPTIONS: tuple[Option, ...] = (
    *(
        Option(
            f"--xyz-{letter}",
            f"X/Y/Z plot: the {axis} axis, 'LABEL: values' as A1111 writes them ('Steps: 4,6', 'CFG Scale: 3-7 (+2)', "
            "'Seed: 1-3 [3]'); writes grid.png (grid-<z>.png per Z value) and each cell's images",
            metavar="'LABEL: VALUES'",
            programs=frozenset({CLI}),
        )
        for letter, axis in (("x", "X (across)"), ("y", "Y (down)"), ("z", "Z (a grid per value)"))
    ),
    Option(
        "--xyz-max-cells",
        "the most cells an X/Y/Z plot may have; a larger plot is refused before anything runs",
        "SDXL_XYZ_MAX_CELLS",
        at_least_one,
        MAX_CELLS,
    ),
)

OPTIONS: tuple[Option, ...] = (
    # -- the model
    Option(
        "--model",
        "Hub id, local diffusers directory (Flax or PyTorch safetensors), or 'tiny'",
        "SDXL_MODEL",
        default_text=SDXL_BASE,
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--revision",
        "Hub revision (branch, tag or commit)",
        default_text=f"{SDXL_BASE_FLAX_REVISION} for SDXL base",
        programs=frozenset({CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--variant",
        "PyTorch weight variant, e.g. fp16 (*.fp16.safetensors)",
        "SDXL_VARIANT",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--unet",
        "whole-UNet .safetensors replacing the model's: PATH or REPO:FILE",
        "SDXL_UNET",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--lora-dir",
        "offer every *.safetensors LoRA in DIR (kohya/A1111, diffusers/PEFT; LoCon), by file name: "
        "<lora:NAME:WEIGHT> in a prompt, the API's `loras`, the page's picker; a file it cannot apply is named and "
        "left out",
        "SDXL_LORA_DIR",
        metavar="DIR",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--embeddings-dir",
        "offer every SDXL textual-inversion embedding (*.safetensors with clip_l and clip_g) "
        "in DIR by file name: the name in a prompt or negative prompt puts its vectors there (A1111's rule); a "
        "file it cannot read (SD 1.5, broken) is named in one line and left out",
        "SDXL_EMBEDDINGS_DIR",
        metavar="DIR",
        programs=frozenset({APP, CLI, PRECOMPILE}),
    ),
    Option(
        "--upscaler-dir",
        "offer every ESRGAN-family model (RRDBNet .safetensors or .pth: R-ESRGAN 4x+, "
        "4x-UltraSharp, ...) in DIR as a hires upscaler, by file name; run on 192 px tiles, compiled at start-up; "
        "a file it cannot read is named in one line and left out",
        "SDXL_UPSCALER_DIR",
        metavar="DIR",
        programs=frozenset({APP, CLI}),
    ),
    Option(
        "--emphasis",
        "A1111's emphasis: (word) ×1.1, [word] ÷1.1, (word:1.3), BREAK; 'original' rescales each "
        "77-token window to its unweighted mean (A1111's default), 'no-norm' does not, 'off' reads brackets as "
        "plain text",
        "SDXL_EMPHASIS",
        choices=EMPHASIS_MODES,
        default=config_default("emphasis"),
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--controlnet",
        "an SDXL ControlNet in diffusers' layout (config.json + safetensors, fp16 variant too): "
        "PATH, Hub REPO or NAME=PATH (repeat; named by its folder); requests use up to 2 (`controlnets`); one "
        "that cannot be loaded is named in one line and left out",
        "SDXL_CONTROLNET",
        kind="append",
        metavar="PATH_OR_REPO",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
        env_list=True,
    ),
    Option(
        "--ip-adapter",
        "an IP-Adapter for image prompts, as h94/IP-Adapter publishes them (.safetensors or .bin, its image_encoder/ "
        "folder beside it): PATH, REPO:FILE (e.g. h94/IP-Adapter:sdxl_models/ip-adapter_sdxl.safetensors) or "
        "NAME=PATH (repeat; named by its file); requests give up to --ip-slots images (`ip_images`)",
        "SDXL_IP_ADAPTER",
        kind="append",
        metavar="PATH_OR_REPO",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
        env_list=True,
    ),
    Option(
        "--ip-slots",
        "image prompts one request may give with --ip-adapter (Fooocus has 4, diffusers any): each is compiled "
        "into the image prompt's programs, an empty one costs a masked token block",
        "SDXL_IP_SLOTS",
        _bounded_int(1, MAX_IP_SLOTS),
        config_default("ip_slots"),
        metavar="N",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--controlnet-units",
        "ControlNets one request may use at once, 1 or 2 (A1111's Multi-ControlNet "
        "units): each count has its own compiled step programs, so 1 compiles half of them",
        "SDXL_CONTROLNET_UNITS",
        _bounded_int(1, MAX_CONTROLNETS),
        config_default("controlnet_units"),
        metavar="N",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--refiner",
        "SDXL's refiner in diffusers' layout (Flax or PyTorch files): PATH or Hub REPO, e.g. "
        "stabilityai/stable-diffusion-xl-refiner-1.0; its UNet continues a request from `refiner_switch` (its text "
        "encoder 2 is the base's when the weights file is the same); every program compiled at start-up",
        "SDXL_REFINER",
        metavar="PATH_OR_REPO",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--lora-cache",
        "LoRAs whose factors stay on the devices between requests, so switching back costs no "
        "transfer; each holds one slot's memory (rank × the touched kernels: 218 MiB for a rank-32 SDXL LoRA in "
        "bf16): lower it for high-rank LoRAs on 16 GiB chips",
        "SDXL_LORA_CACHE",
        _bounded_int(1, 64),
        config_default("lora_cache"),
        metavar="N",
        programs=frozenset({APP, CLI}),
    ),
    Option(
        "--text-cache",
        "texts whose encoded outputs stay on the devices, so a request repeating a recent "
        "prompt, negative prompt, clip skip and LoRA set runs no text encoder (nor, with --cross-attention-cache, "
        "the keys and values): the same pixels; each holds SDXL's 0.6 MiB per image (49 MiB with "
        "--cross-attention-cache); 0 = none",
        "SDXL_TEXT_CACHE",
        _bounded_int(0, MAX_TEXT_CACHE),
        config_default("text_cache"),
        metavar="N",
        programs=frozenset({APP, CLI, BENCH}),
    ),
    Option(
        "--preset",
        "few-step recipe (assets/presets.json): model, UNet file, steps, sampler, spacing, guidance, "
        "size; flags override it; with another model (e.g. tiny) only its sampler settings",
        "SDXL_PRESET",
        choices=PRESET_NAMES,
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    # -- the shape of the compiled programs
    Option(
        "--height",
        "image height in pixels, a multiple of 32",
        "SDXL_HEIGHT",
        int,
        default_text=_shape_text(0),
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--width",
        "image width in pixels, a multiple of 32",
        "SDXL_WIDTH",
        int,
        default_text=_shape_text(1),
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--sizes",
        "offered sizes, each compiled at start-up, the first the default; each side a multiple of 32; "
        "'sdxl' = SDXL's 9 trained sizes; not with --height/--width",
        "SDXL_SIZES",
        metavar="WxH,WxH,...",
        default_text=",".join(f"{width}x{height}" for height, width in default_sizes())
        + " (the same ratios at ~128 px for tiny; --height/--width: that one size)",
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--hires-scales",
        "the hires fix's scales (e.g. 1.5,2): each offered size × each scale (each side "
        "truncated to the UNet's latent multiple) is compiled at start-up and a request's hires_scale picks one",
        "SDXL_HIRES_SCALES",
        metavar="X,Y,...",
        default_text="none (no hires fix)",
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--vae-tile-above",
        "the VAE decodes and encodes images of more pixels than this in feathered 512 px "
        "tiles (bounded memory: a whole 2048² decode needs 8.6 GiB per v5e chip, 0.8 in tiles; "
        "docs/features.md#hires-fix-second-pass)",
        "SDXL_VAE_TILE_ABOVE",
        int,
        config_default("vae_tile_above"),
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--steps",
        "denoising steps of a request that names none (a request may ask for "
        f"{FIELD['steps'].values_text}; no recompile)",
        "SDXL_STEPS",
        _STEPS,
        default_text=_shape_text(2),
        programs=ENGINE,
    ),
    Option(
        "--dtype",
        "network dtype",
        "SDXL_DTYPE",
        choices=DTYPES,
        default_text="bfloat16 on TPU/GPU, float32 on CPU",
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--images-per-device",
        "images each device makes per request (throughput mode): N × devices images, "
        "seeds consecutive, in one call compiled for N at start-up",
        "SDXL_IMAGES_PER_DEVICE",
        at_least_one,
        config_default("per_device_batch"),
        metavar="N",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
        aliases=("--per-device-batch",),
        env_aliases=("SDXL_PER_DEVICE_BATCH",),
    ),
    Option(
        "--merge-requests",
        "with --images-per-device N: each request gets one image per device, and up to N "
        "queued requests that share a size, a number of steps (UNet calls), speed levers, LoRAs, clip skip and "
        "embeddings run as one call, each with its own prompt, seed, guidance, sampler, schedule, progress and Stop "
        "(image to image and inpainting too, each its own picture; ControlNet, hires fix and refiner requests run "
        "alone); one process only. A call makes the largest of N and the powers "
        "of two below it that the waiting requests fill (each compiled at start-up): a lone request runs a "
        "one-image call",
        "SDXL_MERGE_REQUESTS",
        kind="switch",
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--merge-full-calls",
        "with --merge-requests: every call makes N images per device (a lone request's "
        "free blocks are padding), so a request's pixels never depend on how many shared its call; without it, "
        "calls of fewer images give pixels within 1 level of N's",
        "SDXL_MERGE_FULL_CALLS",
        kind="switch",
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--attention",
        "UNet attention core: auto = splash on TPU, cudnn on NVIDIA (bf16), xla elsewhere",
        "SDXL_ATTENTION",
        choices=ATTENTIONS,
        default=config_default("attention"),
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--quantize",
        "experimental: int8 = the UNet's Dense and Conv layers int8 x int8 (qwix post-training: "
        "int8 weights with per-channel scales, activations quantized per call; attention, conv_in/conv_out, text "
        "encoders and VAE unchanged); quality on real SDXL weights unmeasured; not with --lora-dir; not on NVIDIA "
        "GPUs",
        "SDXL_QUANTIZE",
        choices=QUANTIZE_MODES,
        default=config_default("quantize"),
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--xla-option",
        "an XLA compiler option for every served program, NAME=VALUE (repeat), e.g. "
        "xla_gpu_dot_merger_threshold_mb=0 (bench/HISTORY.md measures the GPU's); XLA refuses an unknown name or "
        "value, in one sentence at start-up",
        "SDXL_XLA_OPTIONS",
        kind="append",
        metavar="NAME=VALUE",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
        env_list=True,
    ),
    Option(
        "--region-parts",
        "the part counts of regional prompts (a request's regions, prompt parts split on BREAK) compiled at start-up, "
        "e.g. 2-4 or 2,3 (one part runs the plain programs; none = only those); each count compiles its steps",
        "SDXL_REGION_PARTS",
        metavar="COUNTS",
        default_text=",".join(map(str, config_default("region_parts"))) or "none",
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--prompt-windows",
        "77-token windows a prompt is read in, as A1111 and ComfyUI read long prompts (each "
        "75 tokens of the prompt); 1 = CLIP's 77 tokens, the rest cut",
        "SDXL_PROMPT_WINDOWS",
        _bounded_int(1, MAX_PROMPT_WINDOWS),
        config_default("prompt_windows"),
        metavar="N",
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--steps-per-call",
        "the most denoising steps one call of a step program runs for a request nobody follows step by step (no "
        "progress, previews or Stop: API and CLI calls, merged calls, the bench); each call hands the devices the "
        "UNet's weights anew (about 5 ms of CPU a call on 8 CPU devices), but above 1 each step program takes about "
        "1.45 times as long to compile on XLA:CPU",
        "SDXL_STEPS_PER_CALL",
        _bounded_int(1, int(FIELD["steps"].high)),
        config_default("steps_per_call"),
        metavar="N",
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--no-speed-levers",
        "do not compile the programs of per-request "
        f"{' and '.join(row.name for row in FIELDS if row.lever)} (a shorter start-up; requests then run every step "
        "whole and guided)",
        "SDXL_NO_SPEED_LEVERS",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--cross-attention-cache",
        "project the text's keys and values for the UNet's cross-attention once per "
        "request instead of at every step (the same products and pixels; SDXL: 140 fewer products per step); "
        "the default on CPU devices, off on TPU/GPU until timed there; not with --quantize int8 or --attention "
        "diffusers",
        "SDXL_CROSS_ATTENTION_CACHE",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--no-cross-attention-cache",
        "project the text's keys and values at every step, on CPU devices too (--cross-attention-cache's default "
        "there)",
        "SDXL_NO_CROSS_ATTENTION_CACHE",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--pag",
        "compile the perturbed-attention guidance steps, so requests may set pag_scale (a third UNet batch per "
        "step when they do; requests at 0 run the other programs). Only the base's whole-UNet step is compiled with "
        "it: not with DeepCache, ControlNets or regional prompts (refused), and the refiner's steps run without it",
        "SDXL_PAG",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--freeu-programs",
        "compile the FreeU steps, so requests may set freeu (its factors are data: every value runs them; requests "
        "without run the other programs). Only the base's whole-UNet step is compiled with it: not with DeepCache, "
        "ControlNets or regional prompts (refused), and the refiner's steps run without it",
        "SDXL_FREEU_PROGRAMS",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--no-previews",
        "no live previews on the page (the picture forming, every 2 steps, from SDXL's "
        "latent-to-RGB projection: one small program per size)",
        "SDXL_NO_PREVIEWS",
        kind="switch",
        programs=frozenset({APP, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--no-compilation-cache",
        "do not use JAX's persistent compilation cache nor this host's executables (every start compiles)",
        "SDXL_NO_COMPILATION_CACHE",
        kind="switch",
    ),
    Option(
        "--no-executable-cache",
        "do not keep this host's compiled programs whole beside the compilation cache "
        "(a restart then traces and lowers every program again, and takes XLA's part from JAX's cache)",
        "SDXL_NO_EXECUTABLE_CACHE",
        kind="switch",
    ),
    Option(
        "--cpu-devices",
        "CPU only: JAX devices to split the CPU into, each making --images-per-device images per "
        "request; 0 = one device",
        "SDXL_CPU_DEVICES",
        non_negative,
        default_text="one per core",
        metavar="N",
        programs=ENGINE,
        recompiles=True,
    ),
    Option(
        "--precompiled",
        "load the matching executables written by `python -m pipeline precompile` from DIR; "
        "compile the rest (one line says which and why)",
        "SDXL_PRECOMPILED",
        metavar="DIR",
    ),
    # -- the sampler (the checkpoint's scheduler config unless set)
    Option(
        "--sampler",
        f"sampler of a request that names none: {', '.join(SAMPLER_NAMES)} (a request may pick another; no recompile)",
        "SDXL_SAMPLER",
        sampler_argument,
        default_text="the checkpoint's",
        programs=frozenset({APP, CLI, PRECOMPILE}),
    ),
    Option(
        "--timestep-spacing",
        "timestep spacing",
        "SDXL_TIMESTEP_SPACING",
        choices=SPACINGS,
        default_text="the checkpoint's",
        programs=frozenset({APP, CLI, PRECOMPILE}),
    ),
    Option(
        "--steps-offset",
        "added to leading timesteps",
        "SDXL_STEPS_OFFSET",
        int,
        default_text="the checkpoint's",
        programs=frozenset({APP, CLI, PRECOMPILE}),
    ),
    Option(
        "--prediction-type",
        "what the UNet predicts",
        "SDXL_PREDICTION_TYPE",
        choices=PREDICTION_TYPES,
        default_text="the checkpoint's",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    Option(
        "--no-cfg",
        "guidance-free program: the UNet runs on the prompt only; guidance and negative prompt are "
        "ignored (hidden on the page)",
        "SDXL_NO_CFG",
        kind="switch",
        programs=frozenset({APP, CLI, PRECOMPILE}),
        recompiles=True,
    ),
    # -- one request (CLI only): the request fields' table (pipeline/contract/fields.py)
    *(request_option(row) for row in FIELDS if row.flag),
    *CONTROL_OPTIONS,
    *IMAGE_PROMPT_OPTIONS,
    *XYZ_OPTIONS,
    Option("--out", "directory for the PNG files", required=True, programs=frozenset({CLI})),
    Option("--json", "print a JSON summary instead of text", kind="switch", programs=frozenset({CLI})),
    # -- precompile's own (the executables for a topology)
    Option(
        "--topology",
        "TPU topology (v5e:2x2, v6e:2x2, ...; needs libtpu, not a TPU) or 'cpu' = this host's CPU devices",
        default="v5e:2x2",
        programs=frozenset({PRECOMPILE}),
    ),
    Option("--out", "directory for the executables and manifest.json", required=True, programs=frozenset({PRECOMPILE})),
    # -- make-tiny's own (the tiny random-weight checkpoint)
    Option(
        "directory",
        "the folder the checkpoint is written to (an existing one is replaced)",
        programs=frozenset({MAKE_TINY}),
    ),
    Option("--seed", "weight initialisation seed", type=int, default=0, programs=frozenset({MAKE_TINY})),
    # -- several processes
    Option(
        "--distributed",
        "join a multi-host run detected by JAX (Cloud TPU slice, SLURM, Open MPI); automatic "
        "where the environment names several processes",
        "SDXL_DISTRIBUTED",
        kind="switch",
        group=CLUSTER_GROUP,
    ),
    Option(
        "--coordinator-address",
        "address of process 0, reachable from every process (one machine: 127.0.0.1:PORT)",
        "SDXL_COORDINATOR_ADDRESS",
        metavar="HOST:PORT",
        group=CLUSTER_GROUP,
    ),
    Option("--num-processes", "processes in the run", "SDXL_NUM_PROCESSES", at_least_one, group=CLUSTER_GROUP),
    Option(
        "--process-id",
        "this process, 0 .. num-processes - 1; 0 serves the page",
        "SDXL_PROCESS_ID",
        non_negative,
        group=CLUSTER_GROUP,
    ),
    Option(
        "--cluster-timeout",
        "seconds for all processes to join, and per request",
        "SDXL_CLUSTER_TIMEOUT",
        positive_float,
        config_default("timeout_s", ClusterOptions),
        group=CLUSTER_GROUP,
    ),
    Option(
        "--heartbeat-timeout",
        "seconds of silence after which a process is taken for dead",
        "SDXL_HEARTBEAT_TIMEOUT",
        positive_float,
        config_default("heartbeat_s", ClusterOptions),
        group=CLUSTER_GROUP,
    ),
)


def programs_of(option: Option) -> frozenset[str]:
    """The programs that take `option`: those it names, and SERVE wherever the app takes one of the engine's (this
    table's) options: the engine service is the app's engine without the page."""
    engine_option = any(option is row for row in OPTIONS)
    return option.programs | {SERVE} if engine_option and APP in option.programs else option.programs


def options_for(program: str, table: tuple[Option, ...] = OPTIONS) -> list[Option]:
    """The options of `table` that `program` (APP, CLI, PRECOMPILE, BENCH, SERVE, MAKE_TINY) takes, in table
    order."""
    return [option for option in table if program in programs_of(option)]


def env_values(option: Option) -> list[str]:
    """A repeatable option's values from its environment variable: one value, or a comma-separated list
    (`env_list`, each value stripped, empty ones dropped); [] when it is unset or empty."""
    text = env_value(option)
    if text is None:
        return []
    return [value.strip() for value in text.split(",") if value.strip()] if option.env_list else [text]


class _FromEnvironment(list):
    """A repeatable option's values as its environment variable gave them: the first flag replaces them."""


class _AppendOverEnvironment(argparse.Action):
    """argparse's "append", except that the first flag replaces the environment variable's values (the flag wins)
    instead of adding to them."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: D102 - argparse's own hook
        given = getattr(namespace, self.dest, None)
        kept = [] if given is None or isinstance(given, _FromEnvironment) else list(given)
        setattr(namespace, self.dest, [*kept, values])


def env_value(option: Option) -> str | None:
    """The option's environment variable (else its first older name that is set), if set and non-empty."""
    for name in (option.env, *option.env_aliases) if option.env else ():
        if os.environ.get(name) not in (None, ""):
            return os.environ[name]
    return None


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: "prog: error: what is wrong (see prog --help)", exit status 2.

    argparse prints the whole usage (20+ lines for the app) before the one line that matters.
    """

    def error(self, message: str):  # noqa: D102 - argparse's own hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_options(
    parser: argparse.ArgumentParser, program: str, table: tuple[Option, ...] = OPTIONS, defaults: dict | None = None
) -> None:
    """Add `program`'s options of `table` to `parser`, each defaulting to its environment variable, then to
    `defaults` (a program's own, e.g. the bench's tiny model), then to the table's default."""
    defaults = defaults or {}
    groups: dict[str, argparse._ActionsContainer] = {"": parser}
    for option in options_for(program, table):
        if option.group not in groups:
            groups[option.group] = parser.add_argument_group(option.group)
        add = groups[option.group].add_argument
        env = env_value(option) if option.kind != "append" else None
        default = defaults.get(option.dest, option.default)
        help_text = option.help + option.note(default)
        if option.kind == "switch":
            value = env.strip().lower() in TRUE_WORDS if env is not None else bool(default)
            add(option.flag, *option.aliases, action="store_true", default=value, help=help_text)
        elif option.kind == "append":
            values = _FromEnvironment(env_values(option))
            add(
                option.flag,
                *option.aliases,
                action=_AppendOverEnvironment,
                default=values,
                metavar=option.metavar,
                help=help_text,
            )
        else:
            kwargs: dict = {"default": env if env is not None else default, "help": help_text}
            if option.type is not None:
                kwargs["type"] = option.type  # argparse applies it to a string default (the env value) too
            if option.choices:
                kwargs["choices"] = option.choices
            if option.metavar:
                kwargs["metavar"] = option.metavar
            if option.required:
                kwargs["required"] = True
            add(option.flag, *option.aliases, **kwargs)


def check_env_choices(
    parser: argparse.ArgumentParser, args: argparse.Namespace, program: str, table: tuple[Option, ...] = OPTIONS
) -> None:
    """argparse checks choices of flags only; an environment variable's value gets the same one-line refusal."""
    for option in options_for(program, table):
        value = getattr(args, option.dest, None)
        if option.choices and value is not None and value not in option.choices:
            parser.error(f"{option.env or option.flag}={value!r}: choose one of {', '.join(option.choices)}")


def _values(option: Option) -> str:
    if option.kind == "switch":
        return "switch" + (" (`=1`)" if option.env else "")
    if option.choices:
        return ", ".join(f"`{choice}`" for choice in option.choices)
    if option.type is port_number:
        return "1–65535"
    if option.type is sampler_argument:
        return ", ".join(f"`{name}`" for name in SAMPLER_NAMES)
    if option.type is at_least_one:
        return "whole number ≥ 1"
    if option.type is non_negative:
        return "whole number ≥ 0"
    if hasattr(option.type, "values"):  # a _bounded_int
        return option.type.values
    return {int: "whole number", float: "number", positive_float: "number > 0"}.get(option.type, "text")


def _unset(value: object) -> bool:
    """Whether a default says nothing (None, a switch's False, "" or []): a default of 0 (clip_skip's) is shown."""
    return value is None or value is False or value in ("", [])


def markdown_table(table: tuple[Option, ...]) -> str:
    """docs/options.md's table of options (`python -m web.options` prints it for every option; a test keeps the page
    in step)."""
    rows = [
        "| Flag | Environment variable | Values | Default | Meaning | Recompiles | Taken by |",
        "|---|---|---|---|---|---|---|",
    ]
    for option in table:
        flag = option.flag + (f" {option.metavar}" if option.metavar else "")
        env = (
            f"`{option.env}`" + (f" ({option.env_values_text})" if option.kind == "append" else "")
            if option.env
            else ""
        )
        env += "".join(f" (or `{name}`)" for name in option.env_aliases)
        if option.required or option.positional:
            default = "required"
        elif option.default_text:
            default = option.default_text
        else:
            default = (
                ""
                if _unset(option.default)
                else f"`{option.default:g}`"
                if isinstance(option.default, float)
                else f"`{option.default}`"
            )
        taken = programs_of(option)
        programs = ", ".join(
            [name for program, name in PROGRAM_NAMES.items() if program in taken]
            + sorted(program for program in taken if program not in PROGRAM_NAMES)
        )
        recompiles = "yes" if option.recompiles else ""
        unnamed = [alias for alias in option.aliases if alias not in option.help]  # the help may say it already
        meaning = option.help + (f" (also {', '.join(f'`{a}`' for a in unnamed)})" if unnamed else "")
        rows.append(f"| `{flag}` | {env} | {_values(option)} | {default} | {meaning} | {recompiles} | {programs} |")
    return "\n".join(rows)
