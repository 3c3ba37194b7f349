"""One request contract: every field a request may set, checked once where it enters.

    rules = generator.rules                                   # what this server accepts and assumes
    request = parse_request("a cat", seed=7, steps=30, rules=rules)   # page, API, CLI and Python call this
    result = generator.generate(request)                      # the engine runs it as it is

The page, the API, the CLI and Python code all build a `Request` with `parse_request`; nothing below that edge checks
a field again. The fields, their bounds and their checks are the table of `fields.py`. On several processes the
leader sends `request.to_dict()` and the followers rebuild it with `Request.from_dict` (trusted data, not checked
twice); `request_schema()` describes that data.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import pathlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from PIL import Image

from .controlnet_units import (
    CONTROL_TYPES,
    MAX_CONTROLNETS,
    PREPROCESSORS,
    TILE_MAX_RATE,
    TILE_RATE,
    ControlUnit,
    parse_controls,
)
from .errors import InvalidInput
from .fields import FIELD, PLAIN, Field, check_shape, check_size, check_style, clean_text, echo, resolve_seed
from .hires import UPSCALERS, second_pass_steps
from .image_inputs import MASK_THRESHOLD, ImageInputs, latent_mask, open_image, steps_to_run
from .image_prompts import MAX_IP_SLOTS, ImagePrompt, parse_image_prompts
from .image_prompts import MAX_SCALE as MAX_IP_SCALE
from .inpaint_modes import MaskUse, arranged, prepare_pictures
from .overlay import Paste
from .parameters import PICTURE_STATUS, status_parts
from .presets import lora_of
from .regions import RegionLayout, check_parts, mask_layout, parse_divide, parse_mask
from .sampler_names import check_steps, resolve, sampler_label
from .styles import DEFAULT_STYLE, Style, apply_style, load_styles

#: LoRAs one request may apply at once (the merge program's slots).
MAX_LORAS = 4
#: A LoRA's weight is taken from this range (A1111's UI offers -2..2; trained files go beyond a little).
LORA_WEIGHT_LIMIT = 10.0
#: A1111's prompt tag: <lora:NAME>, <lora:NAME:WEIGHT> or <lora:NAME:TE_WEIGHT:UNET_WEIGHT> (te=/unet= allowed).
LORA_TAG = re.compile(r"<lora:([^:<>]+)(?::([^:<>]*))?(?::([^:<>]*))?>", re.IGNORECASE)


class ServerSettings(Protocol):
    """What `RequestRules.of` reads of a server's static settings: `config.EngineConfig` has them. Named here, not
    imported, so the contract imports nothing of the engine (the options and the config import the contract)."""

    @property
    def offered_sizes(self) -> tuple[tuple[int, int], ...]: ...

    sampler: str | None
    lora_dir: str | None
    default_lora: str | None
    steps: int
    guidance_scale: float
    cfg: bool
    speed_levers: bool
    controlnets: tuple[str, ...]
    ip_adapters: tuple[str, ...]
    refiner: str | None
    hires_scales: tuple[float, ...]


@dataclass(frozen=True)
class RequestRules:
    """What a server accepts, and what it assumes for the fields a request leaves out (from its static settings)."""

    sizes: tuple[tuple[int, int], ...] = ((1024, 1024),)  # compiled (height, width) sizes, the default first
    steps: int = FIELD["steps"].default  # steps of a request that names none
    sampler: str | None = None  # sampler (A1111 name) of a request that names none; None = the checkpoint's
    guidance_scale: float = FIELD["guidance_scale"].default  # guidance of a request that names none
    cfg: bool = True  # False: the guidance-free program runs; negative prompt and guidance are ignored
    levers: bool = True  # cfg_end and deepcache are offered (their programs compiled: not with --no-speed-levers)
    loras: tuple[str, ...] = ()  # the LoRAs offered, by name (--lora-dir)
    default_loras: tuple[tuple[str, float, float], ...] = ()  # a request naming no LoRA gets these (a preset's)
    embeddings: tuple[str, ...] = ()  # the textual-inversion embeddings offered, by name (--embeddings-dir)
    controlnets: tuple[str, ...] = ()  # the ControlNets offered, by name (--controlnet)
    controlnet_units: int = MAX_CONTROLNETS  # the most ControlNets a request uses at once (--controlnet-units)
    union_controlnets: tuple[str, ...] = ()  # those of `controlnets` that are union models (a control_type per unit)
    ip_adapters: tuple[str, ...] = ()  # the IP-Adapters offered, by name (--ip-adapter)
    ip_slots: int = 2  # the most image prompts a request gives (--ip-slots)
    refiner: str = ""  # the refiner's name ("": none; --refiner), which `refiner_switch` below 1 runs
    hires_scales: tuple[float, ...] = ()  # the hires fix's scales (--hires-scales; none: the hires fix is off)
    region_parts: tuple[int, ...] = ()  # the regional prompts' part counts compiled beyond one (--region-parts)
    hires_upscalers: tuple[str, ...] = UPSCALERS  # the hires fix's upscalers by A1111's names (an engine adds its own)
    pag: bool = False  # perturbed-attention guidance is offered (--pag: its step programs compiled)
    freeu: bool = False  # FreeU is offered (--freeu-programs: its step programs compiled)
    styles: Mapping[str, Style] = field(default_factory=load_styles)  # the style templates offered

    @classmethod
    def of(cls, config: ServerSettings) -> RequestRules:
        """The rules a server with `config` will have, known before the model loads (the sampler's default is the
        checkpoint's unless the config sets one: None until then)."""
        sampler = sampler_label(config.sampler) if config.sampler else None  # an id or a name -> the name
        # The files of --lora-dir by name; the engine then offers those it could read (`Generator.rules`).
        directory = pathlib.Path(config.lora_dir) if config.lora_dir else None
        loras = (
            tuple(sorted(p.stem for p in directory.glob("*.safetensors"))) if directory and directory.is_dir() else ()
        )
        by_name = {name.lower(): name for name in loras}
        name, weight = lora_of(config.default_lora) if config.default_lora else ("", 0.0)
        default = ((by_name[name.lower()], weight, weight),) if name.lower() in by_name else ()
        # --upscaler-dir's model files by name; the engine then offers those it could read (`Generator.rules`).
        upscaler_dir = pathlib.Path(getattr(config, "upscaler_dir", None) or "")
        upscalers = (
            tuple(sorted({p.stem for p in upscaler_dir.iterdir() if p.suffix in (".safetensors", ".pth")}))
            if str(upscaler_dir) != "." and upscaler_dir.is_dir()
            else ()
        )
        return cls(
            sizes=config.offered_sizes,
            steps=config.steps,
            sampler=sampler,
            guidance_scale=config.guidance_scale,
            cfg=config.cfg,
            levers=config.speed_levers,
            loras=loras,
            default_loras=default,
            controlnets=tuple(_controlnet_name(spec) for spec in config.controlnets),
            controlnet_units=getattr(config, "controlnet_units", MAX_CONTROLNETS),
            ip_adapters=tuple(adapter_name(spec) for spec in getattr(config, "ip_adapters", ())),
            ip_slots=getattr(config, "ip_slots", 2),
            refiner=refiner_name(config.refiner) if config.refiner else "",
            hires_scales=tuple(getattr(config, "hires_scales", ())),
            region_parts=tuple(getattr(config, "region_parts", ())),
            hires_upscalers=(*UPSCALERS, *upscalers),
            pag=bool(getattr(config, "pag", False)),
            freeu=bool(getattr(config, "freeu_programs", False)),
        )


def adapter_name(spec: str) -> str:
    """The name an --ip-adapter is offered under: NAME of NAME=..., else its file's stem (ip-adapter_sdxl)."""
    name, equals, source = spec.partition("=")
    if equals:
        return name.strip()
    return pathlib.PurePosixPath(spec.strip().replace("\\", "/").rsplit(":", 1)[-1]).stem


def refiner_name(source: str) -> str:
    """The name a --refiner is written under: its folder's (or Hub repo's) last part, as A1111 writes
    `Refiner: <name>` (e.g. stable-diffusion-xl-refiner-1.0)."""
    return source.strip().rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Picture:
    """A request's picture as the engine reads it: decoded once per process."""

    pixels: np.ndarray  # uint8 [H, W, 3]: fitted to the request's size
    repaint: np.ndarray | None  # bool [H, W]: True = repaint; None = the whole picture
    repaint_latents: np.ndarray | None  # float32 [1, H/8, W/8]: `repaint` at latent size; None likewise
    steps_run: int  # the last int(steps × strength) steps of the sampler's plan run
    paste: Paste | None = None  # how the result goes back over the picture (inpaint_modes.py); None: as made


@dataclass(frozen=True)
class Request:
    """One generation request, checked: the engine runs it as it is, and followers receive it as data.

    The plain fields (numbers and choices) take their defaults from the table (`fields.FIELDS`).
    """

    prompt: str  # the user's prompt, cleaned (before the style template)
    negative_prompt: str = ""  # the user's negative prompt, cleaned ("" = none; "" when the server has no CFG)
    style: str = DEFAULT_STYLE  # a name from the server's styles
    seed: int = 0  # image i uses seed (seed + i) mod 2**32; already drawn when the user asked for a random one
    guidance_scale: float = FIELD["guidance_scale"].default  # <= 1 means no guidance (0 when the server has no CFG)
    size: tuple[int, int] = (1024, 1024)  # (height, width): one of the server's compiled sizes
    steps: int = FIELD["steps"].default  # denoising steps
    sampler: str | None = None  # A1111's name of the sampler; None = the server's default (its checkpoint's)
    cfg_end: float = FIELD["cfg_end"].default  # guidance on the first ⌈cfg_end × steps⌉ steps only (1 = every step)
    deepcache: int = FIELD["deepcache"].default  # DeepCache's N: the whole UNet every N steps, shallow between
    loras: tuple[tuple[str, float, float], ...] = ()  # (name, text-encoder weight, UNet weight): up to MAX_LORAS
    init_image: bytes | None = None  # PNG of the picture to start from, fitted to `size` (None: text to image)
    mask_image: bytes | None = None  # PNG of the repaint mask at `size`, 255 = repaint (None: the whole picture)
    strength: float = 1.0  # with a picture: how much of it is redrawn (int(steps × s) steps run); 1 without
    schedule_type: str = FIELD["schedule_type"].default  # A1111's schedule type ("Automatic": the checkpoint's)
    clip_skip: int = FIELD["clip_skip"].default  # the text encoders' layers before the penultimate (0: SDXL's own)
    controlnets: tuple[ControlUnit, ...] = ()  # up to 2 ControlNet units, maps final (controlnet_units.py)
    ip_images: tuple[ImagePrompt, ...] = ()  # image prompts, up to the server's --ip-slots (image_prompts.py)
    refiner_switch: float = FIELD["refiner_switch"].default  # the refiner continues after this part (1 = none)
    aesthetic_score: float = FIELD["aesthetic_score"].default  # the refiner's 5th time id for the prompt
    negative_aesthetic_score: float = FIELD["negative_aesthetic_score"].default  # ... for the negative prompt
    hires_scale: float = FIELD["hires_scale"].default  # the hires fix's upscale (1 = off), one of --hires-scales
    hires_steps: int = FIELD["hires_steps"].default  # the second pass's steps (0 = `steps`)
    hires_denoise: float = FIELD["hires_denoise"].default  # A1111's Denoising strength of the second pass
    hires_upscaler: str = FIELD["hires_upscaler"].default  # A1111's name of the upscaler
    outpaint: str = ""  # pixels added per side, "left=128 right=128" ("": none); the picture is then the canvas
    mask_blur: int = FIELD["mask_blur"].default  # the overlay's soft edge (outpainting, only masked, the overlay)
    inpaint_area: str = FIELD["inpaint_area"].default  # "Whole picture" or "Only masked"
    only_masked_padding: int = FIELD["only_masked_padding"].default  # pixels around the masked box cropped with it
    inpaint_overlay: str = FIELD["inpaint_overlay"].default  # "on": whole-picture inpainting pasted back (A1111's)
    pag_scale: float = FIELD["pag_scale"].default  # perturbed-attention guidance's scale (0 = off)
    pag_adaptive_scale: float = FIELD["pag_adaptive_scale"].default  # its scale lowered by this × (1000 − t)
    freeu: str = FIELD["freeu"].default  # FreeU's "b1,b2,s1,s2" ("" = off)
    regions: str = ""  # Regional Prompter's divide syntax ("" = none, or the mask's regions: contract/regions.py)
    region_mask: bytes | None = None  # PNG of the painted regions at `size`, one colour each (None: none)
    region_base: float = FIELD["region_base"].default  # the base's share with regions (0: every part a region)
    styled_prompt: str = ""  # what the text encoders read: the prompt in the style's template, LoRA tags removed
    written_prompt: str = ""  # what the images' parameters say: the styled prompt with every LoRA's tag, as A1111
    styled_negative_prompt: str = ""  # the style's negative words joined with the user's
    ignored: tuple[str, ...] = ()  # fields the caller set that this server's programs do not read (no CFG)
    decoded: Picture | None = field(default=None, compare=False, repr=False)  # the picture as arrays: not sent

    def to_dict(self) -> dict:
        """Plain JSON-able data (what the leader publishes to the followers): pictures as base64 PNG."""
        data = {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.compare}
        for name in ("init_image", "mask_image", "region_mask"):
            data[name] = None if data[name] is None else base64.b64encode(data[name]).decode("ascii")
        units = [unit.to_dict() for unit in self.controlnets]
        return {
            **data,
            "size": list(self.size),
            "loras": [list(lora) for lora in self.loras],
            "ignored": list(self.ignored),
            "controlnets": units,
            "ip_images": [prompt.to_dict() for prompt in self.ip_images],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Request:
        """Rebuild a request the leader checked and published: trusted, so nothing is checked again."""
        values = dict(data)
        values["size"] = tuple(values["size"])  # JSON has no tuples
        values["loras"] = tuple(tuple(lora) for lora in values.get("loras", ()))
        values["ignored"] = tuple(values.get("ignored", ()))
        values["controlnets"] = tuple(ControlUnit.from_dict(unit) for unit in values.get("controlnets", ()))
        values["ip_images"] = tuple(ImagePrompt.from_dict(prompt) for prompt in values.get("ip_images", ()))
        for name in ("init_image", "mask_image", "region_mask"):
            values[name] = None if values.get(name) is None else base64.b64decode(values[name])
        return cls(**values)

    def plain_values(self) -> dict[str, object]:
        """The table's plain fields by name: what the `parameters` text and the status line are written from."""
        return {row.name: getattr(self, row.name) for row in PLAIN}

    def status_text(self) -> str:
        """What the status line adds for the table's fields: those away from their default (" · CFG end 0.5"), and
        a picture's own with a picture (" · inpainted, strength 0.6"; outpainting's " · outpainted left=16, ..."), a
        regional prompt's divide (" · regions columns 1,2, base 0.3");
        not the hires fix's scale, which the line says with the size (`parameters.status_size`)."""
        started = (
            None
            if self.init_image is None
            else f"outpainted {self.outpaint}"
            if self.outpaint
            else PICTURE_STATUS["inpainting" if self.mask_image is not None else "image to image"]
        )
        values = {**self.plain_values(), "regions": self.regions}
        return "".join(f" · {part}" for part in status_parts(values, started, hires=False))

    def mask_use(self) -> MaskUse:
        """How the request uses its mask: outpainting, only masked, the overlay (inpaint_modes.py)."""
        return MaskUse.of(self.plain_values(), self.outpaint)

    def region_layout(self) -> RegionLayout | None:
        """Where the prompt's parts act (None: no regional prompt): the divide syntax's boxes or the mask's labels."""
        if self.region_mask is not None:
            return mask_layout(self.region_mask)
        return parse_divide(self.regions) if self.regions else None

    def hires_steps_run(self) -> int:
        """The steps the hires fix's second pass runs (A1111's rule: `hires_steps`, else `steps`); 0 when it is
        off."""
        if self.hires_scale == FIELD["hires_scale"].default:
            return 0
        return second_pass_steps(self.steps, self.hires_steps, self.hires_denoise)[1]

    def picture(self, vae_scale_factor: int = 8) -> Picture | None:
        """The picture to start from (None: text to image), decoded from the request's PNGs the first time only."""
        if self.init_image is None:
            return None
        if self.decoded is None:  # a follower: the bytes it received, decoded once
            pixels = np.asarray(Image.open(io.BytesIO(self.init_image)).convert("RGB"))  # [H, W, 3]
            repaint = (
                None
                if self.mask_image is None
                else np.asarray(Image.open(io.BytesIO(self.mask_image))) >= MASK_THRESHOLD
            )  # [H, W]
            decoded = _arranged(
                pixels, repaint, self.mask_use(), steps_to_run(self.steps, self.strength), vae_scale_factor
            )
            object.__setattr__(self, "decoded", decoded)  # a cache beside the frozen fields (not compared, not sent)
        return self.decoded


def request_schema() -> dict:
    """The JSON schema of `Request.to_dict()`: the wire format between processes and over HTTP."""
    text, picture = (
        {"type": "string"},
        {"type": ["string", "null"], "contentEncoding": "base64", "contentMediaType": "image/png"},
    )
    properties: dict[str, dict] = {
        "prompt": {**text, "description": FIELD["prompt"].help},
        "negative_prompt": {**text, "description": FIELD["negative_prompt"].help},
        "style": {**text, "description": FIELD["style"].help},
        "seed": {
            "type": "integer",
            "minimum": FIELD["seed"].low,
            "maximum": FIELD["seed"].high,
            "description": FIELD["seed"].help,
        },
        "size": {
            "type": "array",
            "items": {"type": "integer", "minimum": 1},
            "minItems": 2,
            "maxItems": 2,
            "description": "(height, width): one of the server's compiled sizes",
        },
        "loras": {
            "type": "array",
            "maxItems": MAX_LORAS,
            "description": "[name, text-encoder weight, UNet weight]",
            "items": {"type": "array", "prefixItems": [text, {"type": "number"}, {"type": "number"}]},
        },
        "init_image": picture,
        "mask_image": picture,
        "outpaint": {**text, "description": FIELD["outpaint"].help},
        "regions": {**text, "description": FIELD["regions"].help},
        "region_mask": picture,
        "styled_prompt": text,
        "written_prompt": text,
        "styled_negative_prompt": text,
        "ignored": {"type": "array", "items": text},
        "controlnets": _controlnets_schema(text, picture),
        "ip_images": _ip_images_schema(text, picture),
    }
    for row in PLAIN:
        properties[row.name] = row.schema()
    properties["sampler"] = {"anyOf": [properties["sampler"], {"type": "null"}]}  # None: the server's default
    names = [item.name for item in dataclasses.fields(Request) if item.compare]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Request",
        "type": "object",
        "properties": {name: properties[name] for name in names},
        "required": ["prompt"],
        "additionalProperties": False,
    }


def _ip_images_schema(text: dict, picture: dict) -> dict:
    """The schema of the request's `ip_images`: up to MAX_IP_SLOTS image prompts (image_prompts.py)."""
    return {
        "type": "array",
        "maxItems": MAX_IP_SLOTS,
        "description": FIELD["ip_images"].help,
        "items": {
            "type": "object",
            "required": ["adapter", "image"],
            "properties": {
                "adapter": text,
                "image": picture,
                "scale": {"type": "number", "minimum": 0, "maximum": MAX_IP_SCALE},
                "start": {"type": "number"},
                "end": {"type": "number"},
            },
        },
    }


def _controlnets_schema(text: dict, picture: dict) -> dict:
    """The schema of the request's `controlnets`: up to MAX_CONTROLNETS units, each a served ControlNet's name, its
    control image (a PNG) and how it acts (controlnet_units.py)."""
    return {
        "type": "array",
        "maxItems": MAX_CONTROLNETS,
        "description": FIELD["controlnets"].help,
        "items": {
            "type": "object",
            "required": ["name", "image"],
            "properties": {
                "name": text,
                "image": picture,
                "weight": {"type": "number", "minimum": 0, "maximum": 2},
                "start": {"type": "number"},
                "end": {"type": "number"},
                "module": {"enum": list(PREPROCESSORS)},
                "low": {"type": "integer"},
                "high": {"type": "integer"},
                "rate": {"type": "number", "minimum": TILE_RATE, "maximum": TILE_MAX_RATE},
                "control_type": {"enum": ["", *CONTROL_TYPES]},  # a union ControlNet's; "" for a plain one
            },
        },
    }


def parse_request(
    prompt: object,
    negative_prompt: object = "",
    style: object = DEFAULT_STYLE,
    guidance_scale: object = None,
    seed: object = 0,
    randomize_seed: bool = False,
    *,
    size: object = None,  # (height, width), or text: 'WxH' or the page's '1344×768 (16:9)'
    loras: object = None,
    init_image: object = None,
    mask_image: object = None,
    controlnets: object = None,
    ip_images: object = None,
    outpaint: object = None,
    regions: object = "",
    region_mask: object = None,
    rules: RequestRules | None = None,
    check_prompt: Callable[[str], None] | None = None,
    **plain: object,
) -> Request:
    """Check every field in the order a user would fix them and return the `Request`; one `InvalidInput` otherwise.

    `plain`: the table's numbers and choices by name (steps, sampler, cfg_end, deepcache, strength, ...); None (or
    left out) means the default: the server's (`rules`) for guidance, steps and sampler, else the table's.
    `check_prompt` is a server's own policy on the user's prompt (a word filter): it sees the cleaned prompt only,
    never the style's template or the negative prompt, and raises InvalidInput to refuse. LoRAs come from A1111's
    tags in the prompt and from `loras`, a list of [name, weight] or [name, text-encoder weight, UNet weight].
    `init_image` (and `mask_image`, white = repaint): a path, bytes or PIL image fitted to the size (image_inputs.py).
    `controlnets`: controlnet_units.py; `ip_images`: image_prompts.py; `outpaint`: outpaint.py; `regions`: regions.py.
    """
    rules = rules or RequestRules()
    _check_names(plain)
    text, negative, style_name = _prompts(prompt, negative_prompt, style, rules, check_prompt)
    given = {**plain, "guidance_scale": guidance_scale}
    values = _plain_values(given, rules)
    resolved_seed = resolve_seed(seed, randomize=bool(randomize_seed))
    height, width = _size(size, rules.sizes)
    _check_together(values, rules, picture=init_image is not None, control=bool(controlnets))
    values, negative, ignored = _without_cfg(given, values, negative, rules)
    chosen = _loras(text, loras, rules.loras) or rules.default_loras
    use = MaskUse.of(values, outpaint)
    pictures = _pictures(init_image, mask_image, given, values, use, (height, width), rules)
    units = _controls(controlnets, rules, (height, width), values)
    written = _written_prompts(rules, style_name, text, negative, chosen)
    written |= _regions(regions, region_mask, (height, width), values, rules, units, written["styled_prompt"])
    return Request(
        prompt=text,
        negative_prompt=negative,
        style=style_name,
        seed=resolved_seed,
        size=(height, width),
        loras=chosen,
        controlnets=units,
        ip_images=_image_prompts(ip_images, rules, values, bool(written.get("regions") or written.get("region_mask"))),
        **values,
        **_picture_fields(pictures, use),  # and the outpainting's sides
        **written,  # the prompts as read and written, and the regional fields
        ignored=ignored,
    )


def _pictures(
    image: object, mask: object, given: Mapping, values: Mapping, use: MaskUse, size: tuple, rules: RequestRules
) -> ImageInputs | None:
    """The request's picture and mask checked and prepared at `size` (for outpainting, its grown canvas)."""
    strength = FIELD["strength"].default if given.get("strength") is None else given["strength"]
    height, width = size
    return prepare_pictures(
        image, mask, strength, use=use, height=height, width=width, steps=values["steps"], offered=rules.sizes
    )


def _prompts(
    prompt: object, negative_prompt: object, style: object, rules: RequestRules, check_prompt: Callable | None
) -> tuple[str, str, str]:
    """(the prompt, the negative prompt, the style's name), each checked; the prompt must say something, and a
    server's own policy (`check_prompt`) sees it cleaned, alone."""
    text = clean_text(prompt, field="prompt")
    if not text:
        raise InvalidInput("Please enter a prompt.")
    negative = clean_text(negative_prompt, field="negative prompt")
    style_name = check_style(style, rules.styles)
    if check_prompt is not None:
        check_prompt(text)
    return text, negative, style_name


def _check_together(values: Mapping[str, object], rules: RequestRules, *, picture: bool, control: bool) -> None:
    """The fields that depend on one another or on the server: the speed levers, the refiner, the hires fix (text
    to image only), the sampler (with the steps and a picture)."""
    _check_levers(values, rules)
    _check_unet_extras(values, rules, control)
    _check_refiner(values, rules)
    _check_hires(values, rules, picture or control)
    _check_sampler(values, picture)


def _without_cfg(
    given: Mapping[str, object], values: dict, negative: str, rules: RequestRules
) -> tuple[dict, str, tuple[str, ...]]:
    """(values, negative prompt, ignored fields) as a server without CFG runs them: the guided fields at what the
    guidance-free program reads, no negative prompt, and the fields the caller set that it ignores (`_ignored`). A
    server with CFG: as given, nothing ignored."""
    if rules.cfg:
        return values, negative, ()
    ignored = _ignored(given, values, negative, rules)
    guidance_free = {row.name: row.without_cfg for row in PLAIN if row.without_cfg is not None}
    return {**values, **guidance_free}, "", ignored


def _controls(controlnets: object, rules: RequestRules, size: tuple[int, int], values: Mapping[str, object]) -> tuple:
    """The request's ControlNet units (controlnet_units.py), fitted to `size`; none with DeepCache, whose shallow
    steps skip the blocks the residuals go to."""
    units = parse_controls(
        controlnets, rules.controlnets, *size, most=rules.controlnet_units, unions=rules.union_controlnets
    )
    if units and values.get("deepcache", 1) != 1:
        raise _naming(
            "DeepCache does not combine with ControlNet: set {deepcache} to 1 or drop the {controlnets}.",
            "deepcache",
            "controlnets",
        )
    return units


def _check_names(plain: Mapping[str, object]) -> None:
    """Only the table's plain fields come as keywords (a typo is the caller's bug: TypeError, as Python's own)."""
    unknown = set(plain) - {row.name for row in PLAIN}
    if unknown:
        raise TypeError(f"parse_request() got an unexpected keyword argument {sorted(unknown)[0]!r}")


def _image_prompts(ip_images: object, rules: RequestRules, values: Mapping[str, object], regional: bool) -> tuple:
    """The request's image prompts (image_prompts.py); not with PAG (its perturbed rows would need their own image
    tokens) nor regional prompts (each part would)."""
    prompts = parse_image_prompts(ip_images, rules.ip_adapters, rules.ip_slots)
    if prompts and values.get("pag_scale", 0):
        raise _naming("Image prompts do not combine with PAG here: set {pag_scale} to 0.", "pag_scale")
    if prompts and regional:
        raise _naming("Image prompts do not combine with regional prompts here: leave {regions} empty.", "regions")
    return prompts


def _regions(
    regions: object,
    region_mask: object,
    size: tuple[int, int],
    values: Mapping[str, object],
    rules: RequestRules,
    units: tuple,
    styled_prompt: str,
) -> dict:
    """The Request's regional fields (none when neither `regions` nor `region_mask` is given): the divide syntax
    checked, or the painted mask at the request's size as a PNG; the parts counted (`check_parts`); what does not
    combine with them refused."""
    text = clean_text(regions or "", field="regions")
    if not text and region_mask in (None, ""):
        return {}
    if text and region_mask not in (None, ""):
        raise _naming("Give {regions} or {region_mask}, not both.", "regions", "region_mask")
    if text:
        layout = parse_divide(text)
        fields = {"regions": text}
    else:
        layout = parse_mask(open_image(region_mask, what="region mask"), *size)
        fields = {"regions": "", "region_mask": _png((layout.labels + 1).astype(np.uint8))}
    if values.get("deepcache", 1) != 1 or units or values["hires_scale"] != 1 or values["refiner_switch"] < 1:
        raise _naming(
            "Regional prompts run the whole base UNet at one size: leave {deepcache}, {hires_scale} and "
            "{refiner_switch} at 1 and drop the {controlnets}.",
            "deepcache",
            "hires_scale",
            "refiner_switch",
            "controlnets",
        )
    if values.get("pag_scale", 0) or str(values.get("freeu", "") or "").strip():
        raise _naming(
            "Regional prompts do not combine with FreeU or PAG: leave {freeu} empty and {pag_scale} at 0.",
            "freeu",
            "pag_scale",
        )
    check_parts(layout, values["region_base"], styled_prompt, rules.region_parts)
    return fields


def _written_prompts(rules: RequestRules, style_name: str, text: str, negative: str, chosen: tuple) -> dict[str, str]:
    """The Request's prompts as the encoders read them (the style applied, LoRA tags out; no negative without CFG)
    and as the `parameters` text writes the prompt (with a tag for each chosen LoRA it lacks)."""
    template = rules.styles[style_name]
    styled, styled_negative = apply_style(template, text, negative) if isinstance(template, Style) else (text, negative)
    if not rules.cfg:
        styled_negative = ""
    tagged = {name.lower() for name, *_ in _tags(text)}
    written = " ".join([styled, *(_tag(choice) for choice in chosen if choice[0].lower() not in tagged)])
    return {
        "styled_prompt": " ".join(LORA_TAG.sub(" ", styled).split()),
        "styled_negative_prompt": " ".join(styled_negative.split()),
        "written_prompt": " ".join(written.split()),
    }


def _plain_values(given: Mapping[str, object], rules: RequestRules) -> dict:
    """The table's plain fields checked, in table order: the caller's value, else the server's default (`rules`),
    else the table's. A field that counts with a picture only is the picture's to check (`prepare_image_inputs`)."""
    values = {}
    for row in PLAIN:
        if row.needs == "picture":
            continue
        value = given.get(row.name)
        if value is None:
            value = getattr(rules, row.rule) if row.rule else row.default
        row = offered_row(row, rules)
        values[row.name] = None if value is None else row.check(value)
    return values


def offered_row(row: Field, rules: RequestRules) -> Field:
    """`row` with this server's choices where they are the server's: the hires upscalers are A1111's own and the
    server's ESRGAN models (--upscaler-dir), for the request's check and the page's dropdown alike."""
    if row.name == "hires_upscaler":
        return dataclasses.replace(row, choices=rules.hires_upscalers)
    return row


def asks_for_levers(request: Request) -> bool:
    """Whether `request` sets a speed lever (cfg_end, deepcache) away from its default: only then does it run the
    levers' programs (shallow steps; a guidance-free step after `cfg_end`)."""
    return any(getattr(request, row.name) != row.default for row in PLAIN if row.lever)


#: What a request may add to its UNet with the server's programs (--freeu-programs, --pag): the fields' `needs`, the
#: `RequestRules` flags, the programs' `ProgramKey.extras`, in that order.
UNET_EXTRAS = ("freeu", "pag")


def asks_for_extras(values: Mapping[str, object]) -> tuple[str, ...]:
    """What a request adds to its UNet: "freeu" (`freeu` set) and/or "pag" (`pag_scale` above 0), in the programs'
    order (`ProgramKey.extras`)."""
    return (("freeu",) if values.get("freeu") else ()) + (("pag",) if values.get("pag_scale") else ())


def _check_unet_extras(values: Mapping[str, object], rules: RequestRules, control: bool) -> None:
    """FreeU and PAG need the server's programs (--freeu-programs, --pag); they run on the whole UNet's step, so not
    with DeepCache's shallow steps nor ControlNets' steps."""
    extras = asks_for_extras(values)
    if "freeu" in extras and not rules.freeu:
        raise _naming(
            "This server does not offer FreeU (start it with --freeu-programs): leave {freeu} empty.", "freeu"
        )
    if "pag" in extras and not rules.pag:
        raise _naming("This server does not offer PAG (start it with --pag): {pag_scale} must stay 0.", "pag_scale")
    if extras and values.get("deepcache", 1) != 1:
        raise _naming("DeepCache does not combine with FreeU or PAG: set {deepcache} to 1.", "deepcache")
    if extras and control:
        raise _naming("FreeU and PAG do not combine with ControlNet here: drop the {controlnets}.", "controlnets")


def _check_refiner(values: Mapping[str, object], rules: RequestRules) -> None:
    """`refiner_switch` below 1 needs a server with a refiner; the aesthetic scores only count with it."""
    if values["refiner_switch"] < FIELD["refiner_switch"].default and not rules.refiner:
        raise _naming(
            "This server has no refiner (start it with --refiner): {refiner_switch} must stay 1.", "refiner_switch"
        )


def _check_hires(values: Mapping[str, object], rules: RequestRules, picture_or_control: bool) -> None:
    """`hires_scale` is 1 (off) or one of the server's compiled scales, on text to image without ControlNets (A1111's
    hires fix is txt2img's; its second pass here runs the plain step at the larger size)."""
    scale = values["hires_scale"]
    if scale == FIELD["hires_scale"].default:
        return
    if not rules.hires_scales:
        raise _naming(
            "This server has no hires fix (start it with --hires-scales): {hires_scale} must stay 1.", "hires_scale"
        )
    if scale not in rules.hires_scales:
        raise _naming(
            "{hires_scale} {scale:g} is not offered by this server; choose 1 (off) or one of: {offered}.",
            "hires_scale",
            scale=scale,
            offered=", ".join(f"{s:g}" for s in rules.hires_scales),
        )
    if picture_or_control:
        raise _naming(
            "The hires fix is for text to image: leave {hires_scale} at 1 with a picture or ControlNets.", "hires_scale"
        )


def _naming(template: str, *fields: str, **values: object) -> InvalidInput:
    """A refusal naming `fields` ({field} in `template`) by their API names; a page says its labels instead."""
    return InvalidInput.naming(template, {name: name for name in fields}, **values)


def _check_levers(values: Mapping[str, object], rules: RequestRules) -> None:
    """Without the levers' programs (--no-speed-levers) every lever must stay at its default."""
    levers = [row for row in PLAIN if row.lever]
    if not rules.levers and any(values[row.name] != row.default for row in levers):
        defaults = {f"{row.default:g}" for row in levers}
        must = f"must be {defaults.pop()}" if len(defaults) == 1 else "must be at their defaults"
        named = " and ".join(f"{{{row.name}}}" for row in levers)
        raise _naming(
            f"This server runs every step whole and guided (started with --no-speed-levers): {named} {{must}}.",
            *(row.name for row in levers),
            must=must,
        )


def _check_sampler(values: Mapping[str, object], picture: bool) -> None:
    """A sampler and schedule type that make no sense together (or with the steps, or a picture), in one sentence;
    a server's default sampler (None before the model loads) is checked where its plan is made."""
    if values.get("sampler") is None:
        return
    base, _ = resolve(values["sampler"], values["schedule_type"])
    check_steps(base, values["steps"])
    if picture and base == "lcm":
        raise InvalidInput("LCM runs from noise only here (text to image); pick another sampler for a picture.")


def _ignored(
    given: Mapping[str, object], values: Mapping[str, object], negative: str, rules: RequestRules
) -> tuple[str, ...]:
    """The fields a caller set that a server without CFG ignores: a negative prompt, a guidance other than the
    server's default, any other guided field away from its default."""
    ignored = ["negative_prompt"] if negative else []
    for row in PLAIN:
        if row.without_cfg is not None and given.get(row.name) is not None:
            default = getattr(rules, row.rule) if row.rule else row.default
            if values[row.name] != default:
                ignored.append(row.name)
    return tuple(ignored)


def _picture_fields(pictures: ImageInputs | None, use: MaskUse) -> dict:
    """The Request's picture fields: its PNGs (what travels), the decoded arrays (what this process reads) and the
    outpainting's sides."""
    if pictures is None:
        return {"outpaint": use.outpaint.text}
    mask = None if pictures.repaint is None else _png(pictures.repaint * np.uint8(255))
    decoded = _arranged(pictures.pixels, pictures.repaint, use, pictures.steps_run)
    fields = {"init_image": _png(pictures.pixels), "mask_image": mask, "strength": pictures.strength}
    return {**fields, "decoded": decoded, "outpaint": use.outpaint.text}


def _arranged(
    pixels: np.ndarray, repaint: np.ndarray | None, use: MaskUse, steps_run: int, vae_scale_factor: int = 8
) -> Picture:
    """The picture the engine runs from the request's picture and mask (`inpaint_modes.arranged`: only masked's box
    at the size), with the overlay that pastes its result back."""
    inner, inner_repaint, paste = arranged(pixels, repaint, use)
    latents = None if inner_repaint is None else latent_mask(inner_repaint, vae_scale_factor)
    return Picture(inner, inner_repaint, latents, steps_run, paste)


def _png(array: np.ndarray) -> bytes:
    """An image array as PNG bytes (compression level 1: fast, lossless)."""
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def _tags(text: str) -> list[tuple[str, float, float]]:
    """The LoRAs A1111's tags in `text` ask for: (name as written, text-encoder weight, UNet weight)."""
    found = []
    for match in LORA_TAG.finditer(text):
        name, first, second = match.group(1).strip(), match.group(2), match.group(3)
        te = _weight(first, name, "te") if first not in (None, "") else 1.0
        unet = _weight(second, name, "unet") if second not in (None, "") else te
        found.append((name, te, unet))
    return found


def _weight(text: object, name: str, prefix: str = "") -> float:
    """A LoRA weight from a tag's text ("0.8", "te=0.8") or an API number; one sentence when it is not one."""
    value = text
    if isinstance(text, str):
        value = text.strip()
        if prefix and value.lower().startswith(f"{prefix}="):
            value = value[len(prefix) + 1 :]
        try:
            value = float(value)
        except ValueError:
            value = text
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(float(value))
        or not (-LORA_WEIGHT_LIMIT <= float(value) <= LORA_WEIGHT_LIMIT)
    ):
        raise InvalidInput(
            f"The weight of LoRA {echo(name)} must be a number from {-LORA_WEIGHT_LIMIT:g} to "
            f"{LORA_WEIGHT_LIMIT:g}; got {echo(text)}."
        )
    return float(value)


def _loras(text: str, explicit: object, offered: tuple[str, ...]) -> tuple[tuple[str, float, float], ...]:
    """The request's LoRAs: the prompt's tags, then `explicit` ([name, weight] or [name, te, unet] items)."""
    asked = _tags(text)
    if explicit not in (None, "", [], ()):
        if not isinstance(explicit, list | tuple):
            raise InvalidInput('loras must be a list of [name, weight] pairs, e.g. [["my-style", 0.8]].')
        for item in explicit:
            if not isinstance(item, list | tuple) or len(item) not in (2, 3) or not isinstance(item[0], str):
                raise InvalidInput(f"Each item of loras must be [name, weight] or [name, te, unet]; got {echo(item)}.")
            name = item[0].strip()
            if not name:  # an unused row of the page's picker
                continue
            te = _weight(item[1], name)
            asked.append((name, te, _weight(item[2], name) if len(item) == 3 else te))
    if not asked:
        return ()
    if not offered:
        raise InvalidInput("No LoRAs are offered (they come from --lora-dir DIR).")
    by_name = {name.lower(): name for name in offered}
    chosen = []
    for name, te, unet in asked:
        if name.lower() not in by_name:
            raise InvalidInput(f"Unknown LoRA {echo(name)}; the LoRAs offered: {', '.join(offered)}.")
        if any(existing == by_name[name.lower()] for existing, _, _ in chosen):
            raise InvalidInput(f"LoRA {echo(name)} is asked for twice; give it once, with one weight.")
        chosen.append((by_name[name.lower()], te, unet))
    if len(chosen) > MAX_LORAS:
        raise InvalidInput(f"At most {MAX_LORAS} LoRAs at once; got {len(chosen)}.")
    return tuple(chosen)


def _tag(choice: tuple[str, float, float]) -> str:
    """A1111's tag for a LoRA given through `loras` (the parameters then read back with the same LoRAs)."""
    name, te, unet = choice
    return f"<lora:{name}:{te:g}>" if te == unet else f"<lora:{name}:{te:g}:{unet:g}>"


def _size(size: object, sizes: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(height, width) of a request: None = the default size; text = 'WxH' or the page's label; else a pair."""
    if size is None or isinstance(size, str):
        return check_size(size, sizes)
    height, width = size if isinstance(size, tuple | list) and len(size) == 2 else (size, None)
    check_shape(height, width, sizes)
    return int(height), int(width)


def _controlnet_name(spec: str) -> str:
    """A --controlnet value's name (NAME=PATH, else its folder's or repo's name), known before it loads."""
    name, sep, source = spec.partition("=")
    return name.strip() if sep and name.strip() else pathlib.Path((source if sep else spec).strip().rstrip("/")).name
