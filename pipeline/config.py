"""The engine's static settings, `EngineConfig`, and the one function that resolves them from a command line.

Every field is fixed when the server starts and never comes from a user's request: the fields marked *static* select
(and are baked into) the compiled programs; the others are what a request gets when it names nothing (a request
may pick its own steps, sampler and guidance: traced arguments, never a new program).

    config = engine_config(args)     # app, `python -m pipeline generate|precompile`, the bench: flags, else the
                                     # preset's settings, else the model's defaults
    generator = Generator.load(config)
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from .contract.controlnet_units import MAX_CONTROLNETS
from .contract.errors import InvalidInput
from .contract.fields import FIELD
from .contract.hires import MAX_SCALE, hires_size
from .contract.hires import parse_scales as parse_hires_scales
from .contract.image_prompts import MAX_IP_SLOTS
from .contract.parameters import EMPHASIS_MODES  # noqa: F401  (re-exported: the options table's choices)
from .contract.presets import Preset, get_preset, lora_of
from .contract.regions import parse_part_counts
from .contract.sizes import MAX_SIDE, default_sizes, parse_sizes
from .device.cores import ATTENTIONS

logger = logging.getLogger(__name__)

#: The model the product serves, and the Hub revision where its Flax weights live.
SDXL_BASE = "stabilityai/stable-diffusion-xl-base-1.0"
SDXL_BASE_FLAX_REVISION = "refs/pr/95"

#: `model` value that selects the project's own tiny random-weight checkpoint (built once into a cache dir).
TINY_MODEL = "tiny"

#: Shape each model starts with when the user gives no --height/--width/--steps: (height, width, steps).
#: The tiny model's is small enough to start in seconds on a laptop CPU; every other model gets SDXL's own: 1024²
#: and the steps a request gets by default (the field's, `fields.FIELDS`).
SHAPE_DEFAULTS = {TINY_MODEL: (128, 128, 4)}
SDXL_SHAPE = (1024, 1024, FIELD["steps"].default)

#: Dtypes the engine can run its networks in.
DTYPES = ("bfloat16", "float32")

#: --quantize modes (device/quantize.py; kept here so the options table needs no JAX): none or int8 (experimental).
QUANTIZE_MODES = ("none", "int8")

#: Most 77-token windows a prompt may be read in (8 × 75 = 600 tokens).
MAX_PROMPT_WINDOWS = 8

#: Most texts whose encoded outputs --text-cache keeps on the devices.
MAX_TEXT_CACHE = 64

#: An XLA compiler option's name (DebugOptions' fields: xla_gpu_..., xla_cpu_..., xla_tpu_...); XLA checks the rest.
XLA_OPTION_NAME = re.compile(r"xla_[a-z0-9_]+")

#: The sampler settings a config may set (None = the checkpoint's own).
SAMPLER_FIELDS = ("sampler", "timestep_spacing", "prediction_type", "steps_offset", "cfg")


def shape_defaults(model: str) -> tuple[int, int, int]:
    """(height, width, steps) for `model` when the user sets none: one place for the app, the CLI and the engine."""
    return SHAPE_DEFAULTS.get(str(model).strip(), SDXL_SHAPE)


@dataclass(frozen=True)
class EngineConfig:
    """What the engine loads and compiles, and the defaults of a request; checked when made."""

    model: str = SDXL_BASE  # Hub id, local directory in diffusers' layout (Flax or PyTorch safetensors), or "tiny"
    revision: str | None = None  # Hub revision; SDXL base defaults to refs/pr/95 (its Flax weights)
    variant: str | None = None  # PyTorch weight variant to prefer, e.g. "fp16" (*.fp16.safetensors); Flax has none
    unet: str | None = None  # a whole-UNet .safetensors (path or REPO:FILE) replacing the checkpoint's UNet
    conversion_cache: bool = True  # keep PyTorch weights once converted and cast (<cache root>/converted)
    lora_dir: str | None = None  # static: every *.safetensors LoRA in it is offered (the merge program's layout)
    embeddings_dir: str | None = None  # every SDXL *.safetensors textual-inversion embedding in it is offered
    upscaler_dir: str | None = None  # every ESRGAN (RRDBNet) .safetensors/.pth in it is a hires upscaler, by stem
    emphasis: str = (
        "original"  # static: A1111's emphasis mode: "original", "no-norm" or "off" (host/planning/emphasis.py)
    )
    controlnets: tuple[str, ...] = ()  # static: SDXL ControlNets (PATH, REPO or NAME=PATH); their step programs
    controlnet_units: int = MAX_CONTROLNETS  # static: ControlNets a request may use at once (each count compiles)
    ip_adapters: tuple[str, ...] = ()  # static: IP-Adapter files ([NAME=]PATH or REPO:FILE): image prompts' programs
    ip_slots: int = 2  # static: image prompts one request may give (each slot's tokens are compiled in)
    refiner: str | None = None  # static: SDXL's refiner (PATH or REPO): its encode and step programs (refiner_switch)
    height: int = SDXL_SHAPE[0]  # static: the default size's height in pixels, a multiple of 32
    width: int = SDXL_SHAPE[1]  # static: the default size's width in pixels, a multiple of 32
    sizes: tuple[tuple[int, int], ...] = ()  # static: every offered (height, width), each compiled; () = height×width
    hires_scales: tuple[float, ...] = ()  # static: the hires fix's scales; each offered size × each is compiled
    vae_tile_above: int = 1024 * 1024  # static: images of more pixels are decoded and encoded in tiles (vae_tiles)
    steps: int = SDXL_SHAPE[2]  # denoising steps of a request that names none (each request may ask for 1..100)
    guidance_scale: float = FIELD["guidance_scale"].default  # guidance of a request that names none (a preset's own)
    dtype: str | None = None  # static: weights' and activations' dtype; None = bfloat16 on TPU/GPU, float32 on CPU
    per_device_batch: int = 1  # static: images per device per call (--images-per-device)
    merge_requests: bool = False  # queued requests share a call, one image per device each (host/merging.py)
    merge_full_calls: bool = False  # static: with merging, every call makes N images per device (`merge_call_sizes`)
    attention: str = "auto"  # static: the UNet's attention core (device/attention.py); "auto" is resolved at load
    prompt_windows: int = 3  # static: 77-token windows a prompt is read in (A1111's chunks: 3 = 225 tokens)
    #: static: regional prompts' part counts compiled beyond one (contract/regions.py); none by default: 2-4 add 6
    #: UNet steps per size and their text programs: 46 s on the 87 s warm-up of the tiny checkpoint at 64², 2 CPU cores
    region_parts: tuple[int, ...] = ()
    quantize: str = "none"  # static: "int8" = the UNet's Dense and Conv layers int8 x int8 (device/quantize.py)
    xla_options: tuple[tuple[str, str], ...] = ()  # static: XLA compiler options of every served program (NAME, VALUE)
    speed_levers: bool = True  # static: compile what the per-request speed levers run (host/compiling/programs.py)
    #: static: the text's cross-attention keys and values once per request; None = on for CPU devices, off on TPU/GPU
    #: (resolved at load with the devices' platform, generator.for_platform)
    cross_attention_cache: bool | None = None
    previews: bool = True  # static: compile the live previews' program (a step's picture at latent size)
    #: static: the most denoising steps one step-program call runs for a request nobody follows step by step
    #: (device/step_block.py): fewer calls, less CPU per call on CPU devices; above 1 XLA:CPU takes about 1.45 times
    #: as long to compile each step program (a loop), so 1 unless asked (throughput servers, the bench)
    steps_per_call: int = 1
    pag: bool = False  # static: compile the perturbed-attention guidance steps (per-request pag_scale)
    freeu_programs: bool = False  # static: compile the FreeU steps (per-request freeu)
    lora_cache: int = 8  # LoRAs whose packed factors stay on the devices between requests (host/lora_sets.py)
    text_cache: int = 4  # texts whose encoded outputs stay on the devices between requests; 0: none (text_cache.py)
    compilation_cache: bool = True  # use JAX's persistent compilation cache (restarts reuse compiled code)
    executable_cache: bool = True  # keep this host's executables with the cache (a restart loads them whole)
    sampler: str | None = None  # default sampler of a request (A1111 name or id); None = the checkpoint's
    timestep_spacing: str | None = None  # "leading" / "linspace" / "trailing"; None = the checkpoint's
    prediction_type: str | None = None  # static: "epsilon" / "v_prediction"; None = the checkpoint's
    steps_offset: int | None = None  # added to leading timesteps; None = the checkpoint's
    cfg: bool = True  # static: False = guidance-free program (UNet on the prompt only; guidance, negative ignored)
    preset: str | None = None  # the preset (assets/presets.json) these settings came from, if any
    default_lora: str | None = None  # NAME:WEIGHT of --lora-dir for requests naming no LoRA (a preset's, e.g. LCM's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple((int(h), int(w)) for h, w in self.sizes))
        object.__setattr__(self, "hires_scales", tuple(float(scale) for scale in self.hires_scales))
        object.__setattr__(self, "region_parts", tuple(int(count) for count in self.region_parts))
        object.__setattr__(self, "xla_options", tuple((str(name), str(value)) for name, value in self.xla_options))
        for name, _ in self.xla_options:
            if not XLA_OPTION_NAME.fullmatch(name):
                raise InvalidInput(f"An XLA option's name looks like xla_gpu_enable_triton_gemm; got {name!r}.")
        if any(not 1 < scale <= MAX_SCALE for scale in self.hires_scales):
            raise InvalidInput(f"Each hires scale must be above 1 and at most {MAX_SCALE:g}; got {self.hires_scales}.")
        positive = ("height", "width", "steps", "per_device_batch", "prompt_windows", "lora_cache", "vae_tile_above")
        for name in (*positive, "steps_per_call"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                label = name.replace("_", " ").capitalize()
                raise InvalidInput(f"{label} must be a positive whole number; got {value!r}.")
        for name, most in (("height", MAX_SIDE), ("width", MAX_SIDE), ("steps", FIELD["steps"].high)):
            if getattr(self, name) > most:  # each said as itself: a height refused in words about steps misleads
                raise InvalidInput(f"{name.capitalize()} must be at most {most}; got {getattr(self, name)}.")
        if (
            isinstance(self.text_cache, bool)
            or not isinstance(self.text_cache, int)
            or not 0 <= self.text_cache <= MAX_TEXT_CACHE
        ):
            raise InvalidInput(f"Text cache must be 0 to {MAX_TEXT_CACHE} texts; got {self.text_cache!r}.")
        if not 1 <= self.ip_slots <= MAX_IP_SLOTS or isinstance(self.ip_slots, bool):
            raise InvalidInput(f"Image prompt slots must be 1 to {MAX_IP_SLOTS}; got {self.ip_slots!r}.")
        if not 1 <= self.controlnet_units <= MAX_CONTROLNETS or isinstance(self.controlnet_units, bool):
            raise InvalidInput(f"ControlNet units must be 1 to {MAX_CONTROLNETS}; got {self.controlnet_units!r}.")
        if self.prompt_windows > MAX_PROMPT_WINDOWS:
            raise InvalidInput(f"Prompt windows must be at most {MAX_PROMPT_WINDOWS}; got {self.prompt_windows}.")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InvalidInput(f"Unknown dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}.")
        if self.attention not in ATTENTIONS:
            raise InvalidInput(f"Unknown attention {self.attention!r}; choose one of: {', '.join(ATTENTIONS)}.")
        if self.emphasis not in EMPHASIS_MODES:
            raise InvalidInput(f"Unknown emphasis {self.emphasis!r}; choose one of: {', '.join(EMPHASIS_MODES)}.")
        if self.quantize not in QUANTIZE_MODES:
            raise InvalidInput(f"Unknown quantize mode {self.quantize!r}; choose one of: {', '.join(QUANTIZE_MODES)}.")
        if self.quantize != "none" and self.lora_dir:
            raise InvalidInput(
                "--quantize int8 does not combine with LoRAs (--lora-dir): the LoRA merge needs float kernels."
            )
        if self.merge_requests and self.per_device_batch < 2:
            raise InvalidInput(
                "--merge-requests needs --images-per-device 2 or more: each request takes one image per "
                "device, and a call has room for one request per image a device makes."
            )
        if self.merge_full_calls and not self.merge_requests:
            raise InvalidInput(
                "--merge-full-calls sets the size of --merge-requests' calls: add --merge-requests, or "
                "drop --merge-full-calls."
            )
        if self.cross_attention_cache and (self.quantize != "none" or self.attention == "diffusers"):
            raise InvalidInput(
                "--cross-attention-cache needs a float UNet and an attention core other than diffusers "
                "(not --quantize int8, not --attention diffusers)."
            )

    @property
    def unet_extras(self) -> tuple[str, ...]:
        """What the served whole-UNet steps may add ("freeu", "pag"; `ProgramKey.extras`), as --freeu-programs and
        --pag say."""
        return (("freeu",) if self.freeu_programs else ()) + (("pag",) if self.pag else ())

    @property
    def offered_sizes(self) -> tuple[tuple[int, int], ...]:
        """The offered (height, width) sizes, the default (height × width) first."""
        first = (self.height, self.width)
        return (first,) + tuple(size for size in dict.fromkeys(self.sizes) if size != first)

    @property
    def merge_call_sizes(self) -> tuple[int, ...]:
        """The images per device of the calls --merge-requests runs, each compiled: N, and the powers of two below it
        (N = 8: 1, 2, 4, 8). A call takes the largest that the waiting requests fill, so a lone request runs a
        one-image call, not N images of which one is its own. A call of another size gives a request's images within
        1 level of each other (float rounding of another batch); --merge-full-calls keeps every call at N, so the
        pixels never depend on how many requests shared the call. Without merging: the one batch, N."""
        if not self.merge_requests or self.merge_full_calls:
            return (self.per_device_batch,)
        sizes = [1]
        while sizes[-1] * 2 < self.per_device_batch:
            sizes.append(sizes[-1] * 2)
        return (*sizes, self.per_device_batch)

    def hires_sizes(self, multiple: int) -> dict[tuple[tuple[int, int], float], tuple[int, int]]:
        """{(offered size, scale): the hires size}, for the UNet's latent `multiple` (`contract/hires.hires_size`)."""
        return {
            (size, scale): hires_size(size, scale, multiple)
            for size in self.offered_sizes
            for scale in self.hires_scales
        }

    def sampler_overrides(self) -> dict:
        """The sampler settings this config sets explicitly (None = keep the checkpoint's)."""
        return {name: getattr(self, name) for name in SAMPLER_FIELDS}

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)


def preset_settings(preset: Preset, *, model: str | None = None, **explicit) -> dict:
    """Generator settings for `preset`, explicit values (not None) winning; includes "guidance_scale" (a default).

    Keys: model, steps, sampler, timestep_spacing, cfg, guidance_scale, preset, and, when the preset's own model
    runs, unet, variant, height and width.
    """
    own_model = model is None or model.strip() == preset.model
    settings: dict = {
        "model": preset.model if model is None else model,
        "steps": preset.steps,
        "sampler": preset.sampler,
        "timestep_spacing": preset.timestep_spacing,
        "cfg": preset.cfg,
        "guidance_scale": preset.guidance_scale,
        "preset": preset.name,
    }
    if preset.lora:
        settings["default_lora"] = preset.lora
    if own_model:
        settings.update(unet=preset.unet, variant=preset.variant, height=preset.height, width=preset.width)
    elif model.strip() != TINY_MODEL:
        logger.info("preset %s on %s: its sampler settings only (not its UNet file or size)", preset.name, model)
    settings.update({key: value for key, value in explicit.items() if value is not None})
    return settings


#: What to fetch for a preset's LoRA (its NAME:WEIGHT -> one line, formatted with the preset and the LoRA).
LORA_TO_FETCH = {
    "lcm-lora-sdxl:1": "preset %s runs LCM without its LoRA (%s: not in --lora-dir), which gives blurred pictures: "
    "fetch pytorch_lora_weights.safetensors of latent-consistency/lcm-lora-sdxl (hf download "
    "latent-consistency/lcm-lora-sdxl pytorch_lora_weights.safetensors), save it as lcm-lora-sdxl.safetensors in "
    "a directory and start with --lora-dir DIR"
}


def _has_lora(lora_dir: str | None, lora: str) -> bool:
    """Whether --lora-dir holds the LoRA of a preset's NAME:WEIGHT (any case, as requests name LoRAs)."""
    name = lora_of(lora)[0].lower()
    return bool(lora_dir) and any(path.stem.lower() == name for path in Path(lora_dir).glob("*.safetensors"))


#: Engine settings a program's options may leave unset (a program without the option, or a caller's own
#: namespace): EngineConfig's field default then applies, the one place it is declared (options.config_default).
GIVEN_OR_DEFAULT = (
    "emphasis",
    "per_device_batch",
    "attention",
    "prompt_windows",
    "quantize",
    "lora_cache",
    "text_cache",
    "vae_tile_above",
    "controlnet_units",
    "ip_slots",
    "steps_per_call",
)
#: Settings whose option is named otherwise, by the option's argparse name: the option says what users ask for
#: (`--images-per-device`), the field keeps its name, which the bench and precompiled manifests' settings use.
OPTION_OF = {"per_device_batch": "images_per_device"}


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The config a command line asks for: explicit flags, else the preset's settings, else the model's defaults.

    Takes what `add_options` declared for the program (absent flags count as unset). Offered sizes: `--sizes`; else
    `--height/--width` (or a preset's own size) alone; else the default three for programs that take `--sizes`,
    the model's one size for the others. Raises InvalidInput with one sentence.
    """
    get = vars(args).get
    if get("sizes") and (get("height") is not None or get("width") is not None):
        raise InvalidInput(
            "--sizes and --height/--width do not go together (SDXL_SIZES, SDXL_HEIGHT, SDXL_WIDTH too): --sizes "
            "lists every offered size, the first the default; --height/--width alone offer that one size"
        )
    model, settings = _chosen_settings(get)
    sizes = _offered_sizes(args, model, settings)
    height, width, steps = shape_defaults(model)
    settings = {"height": height, "width": width, "steps": steps, **settings}
    if sizes:
        settings["height"], settings["width"] = sizes[0]
    if settings.get("default_lora") and not _has_lora(get("lora_dir"), settings["default_lora"]):
        logger.warning(
            LORA_TO_FETCH.get(settings["default_lora"], "preset %s: its LoRA %s is not in --lora-dir"),
            settings.get("preset"),
            settings["default_lora"],
        )
        settings.pop("default_lora")
    return EngineConfig(model=model, sizes=sizes, **_static_settings(get), **settings)


def _chosen_settings(get) -> tuple[str, dict]:
    """The model and the settings the flags name (a request's defaults, the sampler's, the UNet file), else the
    preset's; the settings neither names are left out (the model's defaults then apply)."""
    explicit = {
        "height": get("height"),
        "width": get("width"),
        "steps": get("steps"),
        "sampler": get("sampler"),
        "timestep_spacing": get("timestep_spacing"),
        "steps_offset": get("steps_offset"),
        "prediction_type": get("prediction_type"),
        "cfg": False if get("no_cfg") else None,
        "guidance_scale": get("guidance_scale"),
        "unet": get("unet"),
        "variant": get("variant"),
    }
    model = get("model")
    settings = preset_settings(get_preset(get("preset")), model=model, **explicit) if get("preset") else explicit
    settings = {key: value for key, value in settings.items() if value is not None}
    return settings.pop("model", None) or model or SDXL_BASE, settings


def _offered_sizes(args: argparse.Namespace, model: str, chosen: dict) -> tuple[tuple[int, int], ...]:
    """`--sizes`; else the default three for a program that takes `--sizes` and was given no one size (by
    `--height/--width`, or a preset's own size); else () (the one size, height × width)."""
    get = vars(args).get
    tiny = model.strip() == TINY_MODEL
    if get("sizes"):
        return tuple(parse_sizes(get("sizes"), tiny=tiny))
    own_size = (chosen.get("height"), chosen.get("width"))  # flags', else a preset's own size
    one_size = (
        get("height") is not None
        or get("width") is not None
        or (None not in own_size and own_size != shape_defaults(model)[:2])
    )
    return tuple(default_sizes(tiny=tiny)) if "sizes" in vars(args) and not one_size else ()


def _static_settings(get) -> dict:
    """What the engine loads and compiles, as the flags set it (an unset one: `EngineConfig`'s default)."""
    return {
        "revision": get("revision"),
        "lora_dir": get("lora_dir"),
        "embeddings_dir": get("embeddings_dir"),
        "upscaler_dir": get("upscaler_dir"),
        "controlnets": controlnet_specs(get("controlnet")),
        "ip_adapters": controlnet_specs(get("ip_adapter")),
        "refiner": get("refiner") or None,
        "hires_scales": parse_hires_scales(get("hires_scales")),
        **({"region_parts": parse_part_counts(parts)} if (parts := get("region_parts")) is not None else {}),
        "dtype": get("dtype"),
        "speed_levers": not get("no_speed_levers"),
        "cross_attention_cache": cross_attention_cache_of(
            get("cross_attention_cache"), get("no_cross_attention_cache")
        ),
        "merge_requests": bool(get("merge_requests")),
        "merge_full_calls": bool(get("merge_full_calls")),
        "previews": not get("no_previews"),
        "pag": bool(get("pag")),
        "freeu_programs": bool(get("freeu_programs")),
        "xla_options": xla_option_pairs(get("xla_option")),
        "compilation_cache": not get("no_compilation_cache"),
        "executable_cache": not get("no_executable_cache"),
        **{name: value for name in GIVEN_OR_DEFAULT if (value := get(OPTION_OF.get(name, name))) is not None},
    }


def controlnet_specs(values) -> tuple[str, ...]:
    """--controlnet's values (PATH, REPO or NAME=PATH; the flags, else SDXL_CONTROLNET's, read by the options
    table), stripped."""
    return tuple(value.strip() for value in values or () if value.strip())


def xla_option_pairs(values) -> tuple[tuple[str, str], ...]:
    """--xla-option's values (NAME=VALUE; the flags, else SDXL_XLA_OPTIONS', read by the options table) as (name,
    value) pairs in the order given (a name given twice keeps its last value); one sentence for one without "="."""
    texts = [text.strip() for text in values or ()]
    pairs: dict[str, str] = {}
    for text in filter(None, texts):
        name, equals, value = text.partition("=")
        if not equals or not name.strip() or not value.strip():
            raise InvalidInput(f"--xla-option takes NAME=VALUE, e.g. xla_gpu_dot_merger_threshold_mb=0; got {text!r}.")
        pairs.pop(name.strip(), None)
        pairs[name.strip()] = value.strip()
    return tuple(pairs.items())


def cross_attention_cache_of(on: bool | None, off: bool | None) -> bool | None:
    """`EngineConfig.cross_attention_cache` from --cross-attention-cache and --no-cross-attention-cache: True, False,
    or None (neither given: the platform decides at load, generator.for_platform); both is one sentence."""
    if on and off:
        raise InvalidInput("--cross-attention-cache and --no-cross-attention-cache contradict each other: give one.")
    return True if on else False if off else None
