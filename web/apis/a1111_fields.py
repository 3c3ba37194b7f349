"""AUTOMATIC1111's request fields onto this server's table (`pipeline.contract.fields.FIELDS`), one place.

A1111's clients send about fifty fields (`modules/api/models.py`: StableDiffusionTxt2ImgProcessingAPI and its img2img
sibling); those this engine has are mapped, every other one is ignored. Samplers and schedule types are read from the
table's choices (the `sampler` and `schedule_type` fields), never copied here, so a sampler
the table gains is offered here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.controlnet_units import from_a1111
from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD, PLAIN, check_style, echo
from pipeline.contract.image_prompts import split_ip_units
from pipeline.contract.request import RequestRules

from .forge_scripts import forge_scripts

#: Images one A1111 request may ask for (batch_size × n_iter); A1111's UI allows 8 × 100, clients ask for a few.
MAX_IMAGES = 64
#: A1111's fields this module maps itself (the others that share a name with the table pass through as they are).
MAPPED = frozenset(
    {
        "prompt",
        "negative_prompt",
        "seed",
        "steps",
        "cfg_scale",
        "sampler_name",
        "sampler_index",
        "scheduler",
        "width",
        "height",
        "batch_size",
        "n_iter",
        "denoising_strength",
        "styles",
        "refiner_checkpoint",
        "refiner_switch_at",
        "enable_hr",
        "hr_scale",
        "hr_second_pass_steps",
        "hr_upscaler",
        "inpaint_full_res",
        "inpaint_full_res_padding",
    }
)
#: A1111's `hr_scale` when a payload enables the hires fix and names no scale (its API's default).
A1111_HR_SCALE = 2.0
#: A1111's own "no upscaler" (first in /upscalers): as `hr_upscaler` A1111 resizes the picture with PIL's Lanczos
#: (`images.resize_image`), which is this engine's "Lanczos".
NO_UPSCALER, NO_UPSCALER_RESIZE = "None", "Lanczos"
#: A1111's `refiner_switch_at` when a payload names a refiner and no switch (its API's default).
A1111_REFINER_SWITCH = 0.8
#: A1111's setting "Clip skip" in `override_settings` (its slider: 1..12; 1 and 2 are SDXL's own layer, the table's
#: clip_skip 0; N is clip_skip N - 2, `Field.from_label`). The table's own `clip_skip` wins when both are sent.
CLIP_SKIP, CLIP_SKIP_HIGH = "CLIP_stop_at_last_layers", 12
#: A1111 spells "automatic" for the sampler's own schedule.
AUTOMATIC = "automatic"


@dataclass(frozen=True)
class A1111Request:
    """An A1111 payload as the page's handler takes it: its fields, how many images, what was ignored."""

    given: dict[str, Any]  # the handler's inputs by table name (pictures added later)
    count: int  # batch_size × n_iter images
    ignored_scripts: tuple[str, ...] = ()  # alwayson_scripts this server does not run
    notes: tuple[str, ...] = field(default=())


def sampler_choices() -> tuple[str, ...]:
    return tuple(FIELD["sampler"].choices)


def schedule_choices() -> tuple[str, ...]:
    """The table's schedule types ("Automatic", "Karras", ...)."""
    return tuple(FIELD["schedule_type"].choices)


def scheduler_items() -> list[dict]:
    """/sdapi/v1/schedulers: A1111's names (lower case, underscores) and labels of the schedules offered."""
    labels = schedule_choices()
    return [
        {"name": scheduler_name(label), "label": label, "aliases": None, "default_rho": -1, "need_inner_model": False}
        for label in labels
    ]


def scheduler_name(label: str) -> str:
    return label.strip().lower().replace(" ", "_")


def map_sampler(name: object, scheduler: object, default: str) -> dict[str, str]:
    """A1111's `sampler_name` and `scheduler` as the table's `sampler` (and `schedule_type`); the table's sentence
    listing the offered ones when either is not offered (the same as the page's and the other APIs')."""
    samplers, schedules = sampler_choices(), schedule_choices()
    sampler, schedule = default, None
    if name not in (None, ""):
        text = str(name).strip() if isinstance(name, str) else None
        sampler = next((s for s in samplers if text and s.lower() == text.lower()), None)
        for label in schedules:  # an older client's "DPM++ 2M Karras" where the table has both apart
            if sampler is None and text and text.lower().endswith(" " + label.lower()):
                base = text[: -len(label) - 1].strip().lower()
                sampler = next((s for s in samplers if s.lower() == base), None)
                schedule = label if sampler else None
        if sampler is None:
            raise FIELD["sampler"].refusal(name)  # the table's sentence: the page's and every API's
    wanted = scheduler_name(str(scheduler)) if isinstance(scheduler, str) and scheduler.strip() else AUTOMATIC
    if wanted != AUTOMATIC:
        labels = {scheduler_name(label): label for label in schedules}
        if wanted not in labels:
            raise FIELD["schedule_type"].refusal(scheduler)
        schedule = labels[wanted]
    return {"sampler": sampler, **({"schedule_type": schedule} if schedule else {})}


def whole(payload: dict, key: str, default: int, low: int, high: int) -> int:
    """A whole-number field of the payload in [low, high]; one sentence otherwise."""
    value = payload.get(key, default)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or int(value) != value
        or not low <= value <= high
    ):
        raise InvalidInput(f"{key} must be a whole number from {low} to {high}; got {echo(value)}.")
    return int(value)


def offered_size(payload: dict, sizes) -> str:
    """A1111's width and height as an offered 'WxH' (the first offered size when neither is given)."""
    height, width = sizes[0]
    width, height = payload.get("width") or width, payload.get("height") or height
    if (height, width) not in [tuple(size) for size in sizes] or isinstance(width, bool) or isinstance(height, bool):
        offered = ", ".join(f"{w}x{h}" for h, w in sizes)
        raise InvalidInput(
            f"Size {echo(width)}x{echo(height)} is not offered by this server (its programs are "
            f"compiled ahead); choose one of: {offered}."
        )
    return f"{width}x{height}"


def a1111_style(styles: object, offered) -> str | None:
    """A1111's `styles` (a list of names) as the table's one `style`: None for none, the table's sentence for a name
    this server does not offer (as the page and gradio_client are answered), one sentence for more than one."""
    if styles in (None, []):
        return None
    if not isinstance(styles, list):
        raise InvalidInput(f"styles must be a list of style names; got {echo(styles)}.")
    names = [check_style(name, offered) for name in styles]
    if len(set(names)) > 1:
        raise InvalidInput(f"This server applies one style per request; got {len(set(names))}: {', '.join(names)}.")
    return names[0]


def a1111_refiner(payload: dict, rules: RequestRules) -> dict[str, Any]:
    """A1111's `refiner_checkpoint` and `refiner_switch_at` as the table's `refiner_switch`: a checkpoint naming
    this server's --refiner (by its name; a " [hash]" or file extension after it is allowed) runs it from the
    switch (A1111's default 0.8); none (absent, "", "None") runs none, whatever the switch says, as A1111 does."""
    wanted = payload.get("refiner_checkpoint")
    if wanted in (None, "") or (isinstance(wanted, str) and wanted.strip().lower() in ("", "none")):
        return {}
    name = wanted.split(" [", 1)[0].strip() if isinstance(wanted, str) else ""
    for extension in (".safetensors", ".ckpt"):
        name = name[: -len(extension)] if name.lower().endswith(extension) else name
    if not rules.refiner:
        raise InvalidInput(
            f"This server has no refiner (start it with --refiner); got refiner_checkpoint {echo(wanted)}."
        )
    if name.lower() != rules.refiner.lower():
        raise InvalidInput(f"Unknown refiner_checkpoint {echo(wanted)}; this server's refiner is {rules.refiner}.")
    switch = payload.get("refiner_switch_at")
    return {"refiner_switch": A1111_REFINER_SWITCH if switch is None else switch}


def a1111_hires(payload: dict, *, picture: bool) -> dict[str, Any]:
    """A1111's txt2img hires fix as the table's fields: `enable_hr` turns it on with `hr_scale` (default 2),
    `hr_second_pass_steps` (0: the first pass's), `denoising_strength` (txt2img's is the second pass's) and
    `hr_upscaler` (null: "Latent"; "None": Lanczos, as A1111 resizes); off, none of them counts. The scale must be
    one of the server's (parse_request)."""
    if picture or not payload.get("enable_hr"):
        return {}
    upscaler = payload.get("hr_upscaler") or FIELD["hires_upscaler"].default
    hires = {
        "hires_scale": A1111_HR_SCALE if payload.get("hr_scale") is None else payload["hr_scale"],
        "hires_upscaler": NO_UPSCALER_RESIZE if upscaler == NO_UPSCALER else upscaler,
    }
    if payload.get("hr_second_pass_steps") is not None:
        hires["hires_steps"] = payload["hr_second_pass_steps"]
    if payload.get("denoising_strength") is not None:
        hires["hires_denoise"] = payload["denoising_strength"]
    return hires


def a1111_inpaint_area(payload: dict) -> dict[str, Any]:
    """A1111's img2img `inpaint_full_res` (its "Inpaint area": true or 1 is "Only masked") and
    `inpaint_full_res_padding` (its "Only masked padding, pixels"), when a payload sends them; `mask_blur` is the
    table's own name and passes as it is. `inpainting_fill` has no counterpart and is ignored: the masked area here
    always starts from the picture's latents noised by the strength (A1111's "original"), as diffusers' does."""
    area: dict[str, Any] = {}
    if payload.get("inpaint_full_res") is not None:
        area["inpaint_area"] = "Only masked" if payload["inpaint_full_res"] else "Whole picture"
    if payload.get("inpaint_full_res_padding") is not None:
        area["only_masked_padding"] = payload["inpaint_full_res_padding"]
    return area


def a1111_request(payload: dict, rules: RequestRules, *, picture: bool) -> A1111Request:
    """The page handler's fields for an A1111 txt2img/img2img payload (pictures excepted: the caller adds them)."""
    given: dict[str, Any] = {
        "prompt": payload.get("prompt", ""),
        "negative_prompt": payload.get("negative_prompt") or "",
    }
    seed = payload.get("seed", -1)
    if seed is None or (isinstance(seed, int | float) and not isinstance(seed, bool) and seed == -1):
        given["randomize_seed"] = True
    else:
        given.update(seed=seed, randomize_seed=False)
    for ours, theirs in (("steps", "steps"), ("guidance_scale", "cfg_scale")):
        if payload.get(theirs) is not None:
            given[ours] = payload[theirs]
    if picture and payload.get("denoising_strength") is not None:
        given["strength"] = payload["denoising_strength"]
    default_sampler = rules.sampler or sampler_choices()[0]
    given.update(
        map_sampler(
            payload.get("sampler_name") or payload.get("sampler_index"), payload.get("scheduler"), default_sampler
        )
    )
    given["aspect_ratio"] = offered_size(payload, rules.sizes)
    style = a1111_style(payload.get("styles"), rules.styles)
    if style is not None:
        given["style"] = style  # A1111's saved styles by name; this server's styles are its presets
    given.update(a1111_refiner(payload, rules))
    given.update(a1111_hires(payload, picture=picture))
    given.update(a1111_inpaint_area(payload))
    for row in PLAIN:  # the table's own fields by their own names (cfg_end, deepcache, ...), beside A1111's
        if row.name not in given and row.name not in MAPPED and row.name in payload and row.name != "strength":
            given[row.name] = payload[row.name]
    settings = payload.get("override_settings")
    if isinstance(settings, dict) and settings.get(CLIP_SKIP) is not None and "clip_skip" not in given:
        given["clip_skip"] = FIELD["clip_skip"].from_label(whole(settings, CLIP_SKIP, 1, 1, CLIP_SKIP_HIGH))
    count = whole(payload, "batch_size", 1, 1, MAX_IMAGES) * whole(payload, "n_iter", 1, 1, MAX_IMAGES)
    if count > MAX_IMAGES:
        raise InvalidInput(f"batch_size × n_iter asks for {count} images; the limit is {MAX_IMAGES}.")
    scripts = payload.get("alwayson_scripts") or {}
    ignored = tuple(sorted(str(name) for name in scripts)) if isinstance(scripts, dict) else ()
    if "controlnet" in ignored and (rules.controlnets or rules.ip_adapters):  # sd-webui-controlnet's units, served
        control = scripts["controlnet"]
        # its IP-Adapter units (module ip-adapter_clip_sdxl...) are image prompts, the others ControlNets
        ip_units, units = split_ip_units(control.get("args") if isinstance(control, dict) else control)
        given["controlnets"] = from_a1111(units) if units else None
        given["ip_images"] = ip_units or None
        ignored = tuple(name for name in ignored if name != "controlnet")
    if isinstance(scripts, dict):  # Forge's FreeU and PAG, when its clients send them
        forge, used = forge_scripts(scripts)
        given.update({name: value for name, value in forge.items() if name not in given})
        ignored = tuple(name for name in ignored if name not in used)
    return A1111Request(given, count, ignored)
