"""Settings back from an image: AUTOMATIC1111's `parameters` text -> the generation form's fields.

The text is what this app writes (`pipeline.host.images.describe`), what A1111 writes, and what ComfyUI savers that
follow A1111 write: the prompt (any number of lines), a "Negative prompt:" line (and its continuation lines), then
one settings line of "Key: value" pairs separated by commas, where a value holding commas is JSON-quoted
(`Lora hashes: "add_detail: 7c6bad76eb54, grain: 0f3c2d1a9b77"`). The rules follow A1111's own reader
(`parse_generation_parameters` in `modules/infotext_utils.py`, AUTOMATIC1111/stable-diffusion-webui): the last line
is the settings line only when it holds at least three pairs; "WxH" values give a width and a height.
A PNG carries the text in its `parameters` text chunk, a JPEG or WebP in EXIF UserComment; reading it is
`pipeline.host.images.read_parameters`.

    values = read_form_values(path, offered_samplers=SAMPLER_NAMES)     # InvalidInput: one sentence for the page
    values.prompt, values.steps, values.sampler, values.width, values.extra["Lora hashes"], values.notes
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from PIL import Image, UnidentifiedImageError

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELDS
from pipeline.contract.image_inputs import FORMAT_NAMES
from pipeline.host.images import read_parameters

#: Longest `parameters` text read (A1111's are a few hundred characters; Pillow stops text chunks at 1 MB).
MAX_TEXT_CHARS = 65_536
#: Pairs the last line needs to count as the settings line (A1111's rule).
MIN_SETTINGS = 3
#: Keys whose values are numbers, with their type (anything else stays text, e.g. "Model hash: 1234567890"): the
#: request fields' labels (`pipeline.contract.fields.FIELDS`), then A1111's own.
NUMBER_KEYS = {
    **{row.label: int if row.kind in ("int", "seed") else float for row in FIELDS
       if row.label and row.kind in ("int", "seed", "float")},
    "Clip skip": int,
    "Hires upscale": float,
    "Hires steps": int,
    "Hires CFG Scale": float,
    "ENSD": int,
    "Eta": float,
    "Variation seed": int,
    "Variation seed strength": float,
    "Face restoration strength": float,
    "Mask blur": int,
}
#: Refusals (one sentence each).
NOT_AN_IMAGE = f"This file is not a picture in a format this server reads ({FORMAT_NAMES})."
TOO_LARGE = "This image is too large to read."
NO_PARAMETERS = "This image carries no generation settings (no A1111-style parameters in a PNG text chunk or EXIF)."
COMFY_ONLY = "This image was made by ComfyUI without A1111-style parameters, so its settings cannot be read here."
TOO_LONG = f"This image's parameters are longer than {MAX_TEXT_CHARS:,} characters, too long to read."

# One pair of the settings line: `Key: value` or `Key: "quoted, value"`, then a comma or the end. Anything else up to
# the next comma is a loose fragment (e.g. this app's "Sampler: Euler a, v-prediction"), kept with the value before.
_PAIR = re.compile(
    r'\s*(?:(?P<key>\w[\w \-/+.()]*?)\s*:\s*(?P<value>"(?:\\.|[^\\"])*"|[^,]*)|(?P<loose>[^,]*))\s*(?:,|$)'
)
_SIZE = re.compile(r"(\d{1,6})\s*x\s*(\d{1,6})")
_HASH_PAIR = re.compile(r"\s*([^:,]+?)\s*:\s*([^,]*?)\s*(?:,|$)")


@dataclass(frozen=True)
class Infotext:
    """A `parameters` text taken apart."""

    prompt: str  # the prompt lines (joined with newlines)
    negative_prompt: str  # after "Negative prompt:" ("" when absent)
    settings: dict[str, str] = field(default_factory=dict)  # every pair of the settings line, in order, unquoted


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


def parse_infotext(text: str) -> Infotext:
    """Split a `parameters` text into prompt, negative prompt and the settings line's pairs (values unquoted)."""
    lines = str(text).strip().replace("\r\n", "\n").split("\n")
    settings: dict[str, str] = {}
    if len(lines) > 1 or lines[0].strip():
        pairs = _pairs(lines[-1])
        if sum(1 for key, _ in pairs if key is not None) >= MIN_SETTINGS:
            settings = _merge_loose(pairs)
            lines = lines[:-1]
    prompt, negative, in_negative = [], [], False
    for line in lines:
        line = line.strip()
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line[len("Negative prompt:") :].strip()
        (negative if in_negative else prompt).append(line)
    return Infotext(prompt="\n".join(prompt).strip(), negative_prompt="\n".join(negative).strip(), settings=settings)


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


def typed(key: str, value: str):
    """A settings value as a Python value: numbers for `NUMBER_KEYS`, (width, height) for "WxH", {name: hash} for
    "... hashes" (e.g. "Lora hashes", "TI hashes"), the text itself otherwise (and whenever it does not parse)."""
    text = value.strip()
    if key in NUMBER_KEYS:
        try:
            return NUMBER_KEYS[key](text)
        except ValueError:
            return text
    size = _SIZE.fullmatch(text)
    if size:
        return int(size[1]), int(size[2])
    if key.lower().endswith(" hashes"):
        pairs = _HASH_PAIR.findall(text)
        if pairs and all(name and digest for name, digest in pairs):
            return {name: digest for name, digest in pairs}
    return text


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


def _pairs(line: str) -> list[tuple[str | None, str]]:
    """(key, value) for each pair of a settings line, (None, fragment) for a fragment without a key."""
    pairs, position = [], 0
    while position < len(line):
        match = _PAIR.match(line, position)
        if match is None or match.end() == position:  # cannot happen with the fragment branch; a guard all the same
            break
        position = match.end()
        if match["key"] is not None:
            pairs.append((match["key"].strip(), _unquote(match["value"].strip())))
        elif match["loose"].strip():
            pairs.append((None, match["loose"].strip()))
    return pairs


def _merge_loose(pairs: list[tuple[str | None, str]]) -> dict[str, str]:
    """Pairs -> dict; a keyless fragment joins the value before it (", v-prediction" stays with its sampler)."""
    settings: dict[str, str] = {}
    last = None
    for key, value in pairs:
        if key is None:
            if last is not None:
                settings[last] = f"{settings[last]}, {value}"
            continue
        settings[key] = value
        last = key
    return settings


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            unquoted = json.loads(value)
        except ValueError:
            return value
        return unquoted if isinstance(unquoted, str) else value
    return value


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
