"""Settings back from an image: AUTOMATIC1111's `parameters` text -> the generation form's fields.

The text is what this app writes, what A1111 writes, and what ComfyUI savers that follow A1111 write; its one
reader is `pipeline.contract.parameters.parse_infotext` (and `typed` for its values), as its one writer is
`parameters.describe`. A PNG carries the text in its `parameters` text chunk, a JPEG or WebP in EXIF UserComment;
reading it is `pipeline.contract.image_files.read_parameters`. This module adds the file's refusals and the form's
fields.

    values = read_form_values(path, offered_samplers=SAMPLER_NAMES)     # InvalidInput: one sentence for the page
    values.prompt, values.steps, values.sampler, values.width, values.extra["Lora hashes"], values.notes
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from PIL import Image, UnidentifiedImageError

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_files import read_parameters
from pipeline.contract.image_inputs import FORMAT_NAMES
from pipeline.contract.parameters import Infotext, parse_infotext, typed

#: Longest `parameters` text read (A1111's are a few hundred characters; Pillow stops text chunks at 1 MB).
MAX_TEXT_CHARS = 65_536
#: Refusals (one sentence each).
NOT_AN_IMAGE = f"This file is not a picture in a format this server reads ({FORMAT_NAMES})."
TOO_LARGE = "This image is too large to read."
NO_PARAMETERS = "This image carries no generation settings (no A1111-style parameters in a PNG text chunk or EXIF)."
COMFY_ONLY = "This image was made by ComfyUI without A1111-style parameters, so its settings cannot be read here."
TOO_LONG = f"This image's parameters are longer than {MAX_TEXT_CHARS:,} characters, too long to read."


@dataclass(frozen=True)
class FormValues:
    """What the generation form gets from an image; None = leave that field as it is."""

    prompt: str  # the prompt as written (a style's template text included, if one was used)
    negative_prompt: str  # "" when the image had none
    steps: int | None  # "Steps"
    sampler: str | None  # the offered sampler's label ("DPM++ 2M Karras"), None when it is not offered here
    guidance_scale: float | None  # "CFG scale"
    seed: int | None  # "Seed"
    width: int | None  # from "Size: WxH"
    height: int | None
    extra: dict[str, object] = field(default_factory=dict)  # every other pair: typed where known (see `typed`)
    notes: tuple[str, ...] = ()  # one sentence per setting that could not be used as written


def form_values(info: Infotext, offered_samplers: Mapping[str, str] | None = None) -> FormValues:
    """The form's fields from a parsed text. `offered_samplers`: the page's sampler labels -> ids (SAMPLER_NAMES).

    A sampler is matched by A1111 label ("DPM++ 2M Karras", or "DPM++ 2M" with "Schedule type: Karras"),
    by id ("dpmpp_2m_karras"), or as ComfyUI savers write it ("dpmpp_2m karras"); without `offered_samplers`
    the name is passed on as written.
    """
    settings = dict(info.settings)
    notes: list[str] = []
    typed_values = {key: typed(key, value) for key, value in settings.items()}

    def number(key: str):
        value = typed_values.pop(key, None)
        if value is None or isinstance(value, int | float):
            return value
        notes.append(f"{key} {value!r} is not a number, so it was left as it is.")
        return None

    steps, guidance, seed = number("Steps"), number("CFG scale"), number("Seed")
    width = height = None
    size = typed_values.pop("Size", None)
    if isinstance(size, tuple):
        width, height = size
    elif size is not None:
        notes.append(f"Size {size!r} is not WIDTHxHEIGHT, so the size was left as it is.")
    sampler_text = typed_values.pop("Sampler", None)
    schedule = settings.get("Schedule type")
    sampler = None
    if sampler_text is not None:
        sampler = _match_sampler(str(sampler_text), schedule, offered_samplers)
        if sampler is None:
            notes.append(f"Sampler {sampler_text!r} is not offered here, so the sampler was left as it is.")
            typed_values["Sampler"] = sampler_text
        elif schedule is not None and offered_samplers is not None and _normal(sampler) != _normal(str(sampler_text)):
            typed_values.pop("Schedule type", None)  # folded into the sampler's label (A1111's older names)
    return FormValues(
        prompt=info.prompt,
        negative_prompt=info.negative_prompt,
        steps=steps,
        sampler=sampler,
        guidance_scale=None if guidance is None else float(guidance),
        seed=seed,
        width=width,
        height=height,
        extra=typed_values,
        notes=tuple(notes),
    )


def read_infotext(path: str | os.PathLike) -> str:
    """The `parameters` text of an image file; InvalidInput (one sentence) when it is not an image or has none."""
    text = parameters_text(path)
    if not text:
        raise InvalidInput(COMFY_ONLY if _made_by_comfyui(path) else NO_PARAMETERS)
    return text


def parameters_text(source: str | os.PathLike | bytes) -> str:
    """The `parameters` text of an image (a file, or its bytes: A1111's /png-info), "" when it has none; read from
    the header and text chunks only, so a picture cut short still gives its text. InvalidInput (the page's sentence)
    when it is not an image or its text is too long."""
    try:
        text = read_parameters(io.BytesIO(source) if isinstance(source, bytes) else source)
    except Image.DecompressionBombError:
        raise InvalidInput(TOO_LARGE) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, TypeError):
        raise InvalidInput(NOT_AN_IMAGE) from None
    text = _fix_byte_order(text).strip("\0").strip()
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidInput(TOO_LONG)
    return text


def read_form_values(path: str | os.PathLike, offered_samplers: Mapping[str, str] | None = None) -> FormValues:
    """`read_infotext`, `parse_infotext` and `form_values` in one call: what a dropped image fills in."""
    return form_values(parse_infotext(read_infotext(path)), offered_samplers)


def _normal(name: str) -> str:
    return re.sub(r"[\s_\-]+", "_", name.strip().lower())


def _match_sampler(name: str, schedule: str | None, offered: Mapping[str, str] | None) -> str | None:
    """The offered label naming the same sampler as `name` (+ A1111's "Schedule type"), or None."""
    if offered is None:
        return name
    base = re.sub(r",\s*v-prediction$", "", name.strip(), flags=re.IGNORECASE)  # this app's label suffix
    candidates = [base]
    if schedule and schedule.strip().lower() not in ("automatic", ""):
        candidates.insert(0, f"{base} {schedule.strip()}")
    for candidate in candidates:
        wanted = _normal(candidate)
        for label, ident in offered.items():
            if wanted in (_normal(label), _normal(ident)):
                return label
    return None


def _fix_byte_order(text: str) -> str:
    """Undo UTF-16 read with the wrong byte order: some writers put little-endian text after EXIF's "UNICODE\\0"
    prefix, which reads as big-endian (how A1111 writes it) gives one CJK-looking character per ASCII letter."""
    if not text:
        return text
    swapped = sum(1 for char in text if ord(char) & 0xFF == 0 and 0x20 <= ord(char) >> 8 < 0x7F)
    if swapped * 2 <= len(text):
        return text
    raw = text.encode("utf-16-be", errors="surrogatepass")
    return raw.decode("utf-16-le", errors="replace")


def _made_by_comfyui(path) -> bool:
    """ComfyUI keeps its graph as JSON in `prompt` / `workflow` text chunks."""
    try:
        with Image.open(path) as image:
            return any(isinstance(image.info.get(key), str) for key in ("workflow", "prompt"))
    except (OSError, ValueError, SyntaxError):
        return False
