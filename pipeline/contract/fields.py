"""Checks of one request field each, shared by every entry point through `request.parse_request`.

Every rejection is an InvalidInput whose message is a single readable sentence (what is wrong, what is allowed),
so the page can show str(error) as-is. Kept free of JAX so the page can import it cheaply.
"""

from __future__ import annotations

import math
import numbers
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput
from .hires import MAX_SCALE, UPSCALERS
from .sampler_names import SAMPLER_NAMES, SCHEDULE_TYPES
from .styles import DEFAULT_STYLE

Size = tuple[int, int]  # (height, width)

MAX_PROMPT_CHARS = 2000

# Longest slice of user input quoted back in a message; keeps errors readable and avoids reflecting big payloads.
_ECHO_CHARS = 40
# Inputs this many times over the cap are rejected before cleaning, so a huge paste costs no per-character work.
_RAW_FACTOR = 10
# Unicode categories removed outright: control, format (zero-width, bidi overrides) and lone surrogates,
# which cannot be encoded to UTF-8 and would break tokenizers and PNG text chunks.
_DROP_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


def echo(value: object) -> str:
    """Quote a user value for a message: control characters removed, at most _ECHO_CHARS characters."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = repr(value)
        except (ValueError, TypeError, RuntimeError):  # e.g. an int past sys.get_int_max_str_digits()
            text = "an oversized value"
    text = " ".join(_strip_controls(text[: _ECHO_CHARS * 4]).split())
    if len(text) > _ECHO_CHARS:
        text = text[: _ECHO_CHARS - 1] + "…"
    return f"'{text}'" if isinstance(value, str) else text


def _strip_controls(text: str) -> str:
    """Whitespace of any kind becomes a space; other control/format characters are dropped."""
    return "".join(
        " " if char.isspace() else char
        for char in text
        if char.isspace() or unicodedata.category(char) not in _DROP_CATEGORIES
    )


def _type_name(value: object) -> str:
    return type(value).__name__


def clean_text(value: object, *, field: str = "prompt", max_chars: int = MAX_PROMPT_CHARS) -> str:
    """Normalise free text from a form: drop invisible controls, collapse whitespace, strip, enforce the cap.

    The cap is checked after cleaning, so stray whitespace never pushes an otherwise valid prompt over it.
    """
    label = field[:1].upper() + field[1:]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInput(f"{label} must be text; got a value of type {_type_name(value)}.")
    if len(value) > max_chars * _RAW_FACTOR:
        raise InvalidInput(f"{label} is too long: {len(value):,} characters; the limit is {max_chars:,}.")
    text = " ".join(_strip_controls(value).split())
    if len(text) > max_chars:
        raise InvalidInput(f"{label} is too long: {len(text):,} characters; the limit is {max_chars:,}.")
    return text


def resolve_seed(seed: object, randomize: bool = False) -> int:
    """Return the seed to use: a fresh random one if asked, else the given whole number in the table's bounds.

    Floats with an integral value are accepted because Gradio's Number component sends floats.
    """
    if randomize:
        return secrets.randbelow(FIELD["seed"].high + 1)
    row = FIELD["seed"]
    if seed is None or (isinstance(seed, str) and not seed.strip()):  # the page's emptied box: not "got None"
        raise InvalidInput(
            f"Seed is empty; enter a whole number from {_number(row.low)} to {_number(row.high)}, "
            "or turn on Randomize seed."
        )
    message = row.refusal(seed)
    if isinstance(seed, bool):
        raise message
    if isinstance(seed, numbers.Integral):
        number = int(seed)
    elif isinstance(seed, numbers.Real):
        as_float = float(seed)
        if not math.isfinite(as_float) or not as_float.is_integer():
            raise message
        number = int(as_float)
    elif isinstance(seed, str):
        digits = seed.strip()
        if not digits.isascii() or not digits.isdigit() or len(digits) > 20:
            raise message
        number = int(digits)
    else:
        raise message
    if not row.low <= number <= row.high:
        raise message
    return number


def check_style(name: object, styles: Mapping[str, object]) -> str:
    """Return the style name if it is one of the presets; None (a cleared dropdown) means the default style."""
    if name is None:
        name = DEFAULT_STYLE
    if isinstance(name, str) and name in styles:
        return name
    choices = ", ".join(styles)
    raise InvalidInput(f"Unknown style {echo(name)}; choose one of: {choices}.")


def _size_text(height: object, width: object) -> str:
    return f"{width}×{height}"


def check_shape(height: object, width: object, supported: Iterable[tuple[int, int]]) -> None:
    """Reject any (height, width) the engine did not compile: a new size would mean a long recompile.

    Sizes are written width×height, the usual image notation; supported pairs are (height, width).
    """
    sizes = [tuple(size) for size in supported]
    if any(isinstance(part, bool) for part in (height, width)):
        sizes = []  # True == 1 would otherwise slip through the comparison below
    elif (height, width) in sizes:
        return
    got = _size_text(echo(height), echo(width))
    if not sizes:
        raise InvalidInput(f"This server has no compiled image size that matches; got {got}.")
    compiled = " or ".join(_size_text(*size) for size in sizes)
    raise InvalidInput(f"This server compiled {compiled} only; got {got}.")


def check_size(value: object, sizes: Sequence[Size]) -> Size:
    """The (height, width) a user chose as text: 'WxH', optionally followed by a label in brackets (the page's
    '1344×768 (16:9)'), or a ratio 'W:H' (the offered size of that shape, within 10%: '16:9' is 1344×768 for SDXL
    and 224×128 for the tiny model, so one call works on both); None or "" means the first (default) size."""
    if value is None or value == "":
        return tuple(sizes[0])
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d{1,5})\s*[x×]\s*(\d{1,5})\s*(\(.*\))?\s*", value)
        if match and (int(match[2]), int(match[1])) in [tuple(s) for s in sizes]:
            return (int(match[2]), int(match[1]))
        ratio = re.fullmatch(r"\s*(\d{1,3})\s*:\s*(\d{1,3})\s*", value)
        if ratio and int(ratio[1]) and int(ratio[2]):

            def off(size: Size) -> float:  # how far a size's shape is from the ratio asked (0: the same)
                return abs(math.log(size[1] / size[0] * int(ratio[2]) / int(ratio[1])))

            closest = min(sizes, key=off)
            if off(closest) < math.log(1.1):
                return tuple(closest)
    offered = ", ".join(f"{w}×{h}" for h, w in sizes)
    shown = echo(value if isinstance(value, str) else type(value).__name__)
    raise InvalidInput(
        f"Aspect ratio {shown} is not offered by this server; choose one of: {offered} (or its ratio, e.g. 1:1)."
    )


# ---- the table of request fields -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    """How the page shows a field: a slider for a number, a dropdown for a choice (gradio's keywords). Plain data,
    no Gradio: the page (web/page/form.py, layout.py) builds the control from it; nothing in the engine reads it."""

    label: str  # the control's label
    info: str = ""  # the line under it ({low} and {high}: the field's bounds)
    step: float = 1  # a slider's step (its lowest value is `step` above an excluded low bound)
    elem_id: str = ""  # the element's id (CSS, browser tests)
    group: str = ""  # the page's row for it: "style", "sampling", "levers", "picture", "refiner", "hires" ("": own row)


@dataclass(frozen=True)
class Field:
    """One input of a request, declared once: everything below derives from it.

    "Plain" fields (kind int, float or choice) are handled by the table alone: `parse_request`'s check, the
    `Request` attribute's default, the CLI flag, the API parameter and its docstring line, the page control, the
    `parameters` text and its reading back, the status line, the settings the history keeps and the JSON schema.
    The other kinds (text, style, seed, flag, size, loras, file) name their own checks and controls; the table gives
    them their place in the API, their help text and their CLI flag.
    """

    name: str  # the API parameter, `parse_request`'s keyword, the `Request` attribute, the settings key
    kind: str  # int, float, choice, factors (comma-separated numbers, "" = off) | text, style, seed, flag, size, ...
    help: str  # one line: the API's docstring, the CLI's --help
    default: Any = None  # when a request leaves it out (`rule` names the server's own default instead)
    low: float | None = None  # lowest value (numbers)
    high: float | None = None  # highest value (numbers)
    above: bool = False  # `low` itself excluded (0 < x)
    choices: tuple[str, ...] = ()  # a choice's values, as spelled for users
    choice_aliases: tuple[tuple[str, str], ...] = ()  # other spellings of a choice's values: (alias, value)
    rule: str = ""  # the `RequestRules` attribute holding this server's default (steps, sampler, guidance)
    called: str = ""  # how refusals name it to the APIs and the CLI ("Steps", "cfg_end"); the page says its label
    low_note: str = ""  # said after the low bound in a refusal ("(off)")
    high_note: str = ""  # said after the high bound ("(1 = guidance on every step)")
    label: str = ""  # its key in A1111's `parameters` ("" = not written)
    label_offset: int = 0  # the `parameters` number is the value + this (A1111's "Clip skip: 2" is clip_skip 0)
    basic: bool = False  # `parameters` always carries it among A1111's basics (parameters.describe writes it)
    status: str = ""  # how the status line and the history name it away from its default (a picture's: with one)
    without_cfg: Any = None  # its value when the server runs the guidance-free program (None: it keeps its own)
    needs: str = ""  # "picture": it counts with a picture only (checked with the picture); "refiner": with --refiner;
    # "hires": with --hires-scales, written whenever hires_scale is on; "mask": how a mask is used (inpaint_modes.py
    # writes it, when the request pastes its picture back); "pag", "freeu": with --pag, --freeu-programs;
    # "regions": written with regions only
    lever: bool = False  # a speed lever: its programs are compiled only with the levers (--no-speed-levers: off)
    flag: str = ""  # the CLI flag of `python -m pipeline generate` ("" = none, or an engine option sets it)
    aliases: tuple[str, ...] = ()  # older spellings of the flag, still taken
    api_type: Any = None  # the API parameter's annotation
    control: Control | None = None  # how the page shows a plain field (None: not by the table); page only
    count: int = 0  # factors: how many numbers ("b1,b2,s1,s2": 4), each within low..high

    @property
    def plain(self) -> bool:
        return self.kind in ("int", "float", "choice", "factors")

    @property
    def textual(self) -> bool:
        """Its value is text (a choice, or factors as "1.3,1.4,0.9,0.2"), not a number."""
        return self.kind in ("choice", "factors")

    @property
    def values_text(self) -> str:
        """The values it takes, for --help and the README: "1..100", "0 < x <= 1", "Euler, Euler a"."""
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind == "factors":
            return f"empty (off) or {self.count} numbers {_number(self.low)}..{_number(self.high)}, comma-separated"
        if self.above:
            return f"{_number(self.low)} < x <= {_number(self.high)}"
        return f"{_number(self.low)}..{_number(self.high)}"

    def refusal(self, value: object) -> InvalidInput:
        """The one sentence that refuses `value` for this field, naming it as `called` (a page names it by its
        label instead: `InvalidInput.named`)."""
        named = {self.name: self.called}
        if self.kind == "choice":
            return InvalidInput.naming(
                f"Unknown {{{self.name}}} {{value}}; choose one of: {{choices}}.",
                named,
                value=echo(value),
                choices=", ".join(self.choices),
            )
        low, high = f"{_number(self.low)}{self.low_note}", f"{_number(self.high)}{self.high_note}"
        if self.kind == "factors":
            return InvalidInput.naming(
                f"{{{self.name}}} must be empty (off) or {self.count} numbers from {{low}} to {{high}} separated by "
                "commas; got {value}.",
                named,
                low=low,
                high=high,
                value=echo(value),
            )
        if self.kind == "int" or self.kind == "seed":
            allowed = f"a whole number from {low} to {high}"
        elif self.above:
            allowed = f"a number above {low} and at most {high}"
        else:
            allowed = f"a number between {low} and {high}"
        return InvalidInput.naming(
            f"{{{self.name}}} must be {{allowed}}; got {{value}}.", named, allowed=allowed, value=echo(value)
        )

    def check(self, value: object) -> Any:
        """`value` checked: an int or float within the bounds (whole-valued floats pass for int, as Gradio's
        slider sends 30.0), or a choice as spelled in `choices` (case and surrounding spaces ignored)."""
        if self.kind == "choice":
            if isinstance(value, str):
                for option in self.choices:
                    if value.strip().lower() == option.lower():
                        return option
                for alias, option in self.choice_aliases:
                    if value.strip().lower() == alias:
                        return option
            raise self.refusal(value)
        if self.kind == "factors":
            return self._factors(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self.refusal(value)
        try:
            number = float(value)
        except (OverflowError, ValueError):
            raise self.refusal(value) from None
        inside = (self.low < number if self.above else self.low <= number) and number <= self.high
        if not math.isfinite(number) or not inside or (self.kind == "int" and not number.is_integer()):
            raise self.refusal(value)
        return int(number) if self.kind == "int" else number

    def _factors(self, value: object) -> str:
        """`count` numbers in the bounds, as "1.3, 1.4, 0.9, 0.2" or a list: written "1.3,1.4,0.9,0.2" ("": off)."""
        if isinstance(value, str):
            if not value.strip():
                return ""
            parts: Sequence[object] = value.split(",")
        elif isinstance(value, Sequence) and value:
            parts = value
        else:
            raise self.refusal(value)
        numbers_given = []
        for part in parts:
            try:
                number = float(part.strip() if isinstance(part, str) else part)
            except (TypeError, ValueError, OverflowError):
                raise self.refusal(value) from None
            if isinstance(part, bool) or not math.isfinite(number) or not self.low <= number <= self.high:
                raise self.refusal(value)
            numbers_given.append(number)
        if len(numbers_given) != self.count:
            raise self.refusal(value)
        return ",".join(_number(number) for number in numbers_given)

    def to_label(self, value: Any) -> Any:
        """`value` as the `parameters` text (and A1111's API) numbers it."""
        return value + self.label_offset if self.label_offset else value

    def from_label(self, number: float) -> float:
        """A number A1111 wrote (`parameters`, its API) as this field's value: the offset taken off, and a number
        below the field's lowest (A1111's "Clip skip: 1", which SDXL reads as 2) raised to it."""
        return max(self.low, number - self.label_offset) if self.label_offset else number

    def schema(self) -> dict:
        """This field's value in JSON schema terms."""
        if self.kind == "choice":
            return {"enum": list(self.choices), "description": self.help}
        if self.kind == "factors":
            return {"type": "string", "description": f"{self.help}: {self.values_text}"}
        number = {"type": "integer" if self.kind == "int" else "number", "description": self.help}
        number["exclusiveMinimum" if self.above else "minimum"] = self.low
        return {**number, "maximum": self.high}


def _number(value: float) -> str:
    """A bound as a refusal writes it: 20, 0.5, 4294967295."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


#: Every input of a request, in the API's order (a new field goes at the end: API callers pass them by position).
FIELDS: tuple[Field, ...] = (
    Field(
        "prompt", "text", "what to draw (A1111's <lora:NAME:WEIGHT> tags apply LoRAs)", flag="--prompt", api_type=str
    ),
    Field("negative_prompt", "text", "what to keep out", "", without_cfg="", flag="--negative-prompt", api_type=str),
    Field("style", "style", "a style of assets/styles.json", DEFAULT_STYLE, flag="--style", api_type=str),
    Field(
        "guidance_scale",
        "float",
        "how closely to follow the prompt (<= 1: no guidance)",
        5.0,
        low=0.0,
        high=20.0,
        rule="guidance_scale",
        called="Guidance scale",
        label="CFG scale",
        basic=True,
        without_cfg=0.0,
        flag="--guidance-scale",
        api_type=float,
        control=Control(
            "Guidance scale",
            "How closely to follow the prompt ({low:g} to {high:g}; a number typed "
            "outside is set to the nearest limit)",
            step=0.5,
            elem_id="guidance",
            group="style",
        ),
    ),
    Field(
        "seed",
        "seed",
        "0..4294967295: image i uses seed + i",
        0,
        low=0,
        high=2**32 - 1,
        called="Seed",
        label="Seed",
        basic=True,
        flag="--seed",
        api_type=int,
    ),
    Field("randomize_seed", "flag", "a fresh random seed instead of `seed`", True, api_type=bool),
    Field("aspect_ratio", "size", "an offered size: 'WxH' or its ratio 'W:H'", api_type=str),
    Field(
        "steps",
        "int",
        "denoising steps (no recompile)",
        25,
        low=1,
        high=100,
        rule="steps",
        called="Steps",
        label="Steps",
        basic=True,
        api_type=int,
        control=Control(
            "Steps",
            "Denoising steps, {low:g} to {high:g}; any number runs without recompiling (a "
            "number typed outside is set to the nearest limit)",
            elem_id="steps",
            group="sampling",
        ),
    ),
    Field(
        "sampler",
        "choice",
        "A1111's name of the sampler",
        choices=tuple(SAMPLER_NAMES),
        rule="sampler",
        called="sampler",
        label="Sampler",
        basic=True,
        api_type=str,
        control=Control("Sampler", elem_id="sampler", group="sampling"),
    ),
    Field(
        "cfg_end",
        "float",
        "guidance on the first part of the steps only: 0.5 = the first half (faster; changes the picture)",
        1.0,
        low=0.0,
        high=1.0,
        above=True,
        called="cfg_end",
        high_note=" (1 = guidance on every step)",
        label="CFG end",
        status="CFG end",
        without_cfg=1.0,
        lever=True,
        flag="--cfg-end",
        api_type=float,
        control=Control(
            "Guidance for the first part of the steps",
            "1 = every step (exact); 0.5 = the first half: faster, changes the picture",
            step=0.05,
            elem_id="cfg-end",
            group="levers",
        ),
    ),
    Field(
        "deepcache",
        "int",
        "DeepCache: the whole UNet every N steps, its shallow part between (1 = off; faster, changes the picture)",
        1,
        low=1,
        high=5,
        called="deepcache",
        low_note=" (off)",
        high_note=" (the whole UNet every N steps)",
        label="DeepCache",
        status="DeepCache",
        lever=True,
        flag="--deepcache",
        api_type=int,
        control=Control(
            "DeepCache",
            "1 = off (exact); N = the whole UNet every N steps, its shallow part between: faster, changes the picture",
            elem_id="deepcache",
            group="levers",
        ),
    ),
    Field(
        "loras",
        "loras",
        "up to 4 [name, weight] (or [name, te_weight, unet_weight]) of the server's LoRAs",
        flag="--lora",
        api_type=list,
    ),
    Field(
        "init_image",
        "file",
        "start from this picture (image to image), fitted to the size: resized to cover it, centre-cropped",
        flag="--init-image",
        api_type=dict,
    ),
    Field(
        "mask_image",
        "file",
        "inpainting: white = repaint, black = keep (needs init_image)",
        flag="--mask-image",
        aliases=("--mask",),
        api_type=dict,
    ),
    Field(
        "strength",
        "float",
        "with a picture: how much of it is redrawn (int(steps × strength) steps run)",
        0.75,
        low=0.0,
        high=1.0,
        above=True,
        called="Strength",
        label="Denoising strength",
        status="strength",
        needs="picture",
        flag="--strength",
        api_type=float,
        control=Control(
            "Strength",
            "How much of the picture is redrawn: 0.3 keeps most of it, 1 redraws it all",
            step=0.05,
            elem_id="strength",
            group="picture",
        ),
    ),
    Field(
        "schedule_type",
        "choice",
        "A1111's schedule type: the sampler's noise levels (Automatic: the checkpoint's)",
        "Automatic",
        choices=SCHEDULE_TYPES,
        called="schedule type",
        label="Schedule type",
        status="schedule",
        flag="--schedule-type",
        api_type=str,
        control=Control(
            "Schedule type",
            "Automatic = the checkpoint's; Karras, Exponential, SGM Uniform (trailing)",
            elem_id="schedule-type",
            group="sampling",
        ),
    ),
    Field(
        "controlnets",
        "controls",
        "up to 2 {name, image, weight 0..2, start, end, preprocessor none|canny} of the server's ControlNets",
        flag="--control-image",
        api_type=list,
    ),
    Field(
        "ip_images",
        "image_prompts",
        "image prompts (IP-Adapter): up to the server's --ip-slots {image, adapter, scale 0..2, start, end} of its "
        "--ip-adapter files",
        flag="--ip-image",
        api_type=list,
    ),
    Field(
        "refiner_switch",
        "float",
        "with the server's --refiner: the part of the steps the base runs before its "
        "refiner continues (A1111's Switch at; 1 = no refiner)",
        1.0,
        low=0.0,
        high=1.0,
        above=True,
        called="refiner_switch",
        high_note=" (1 = no refiner)",
        label="Refiner switch at",
        status="refiner at",
        needs="refiner",
        flag="--refiner-switch",
        api_type=float,
        control=Control(
            "Refiner switch at",
            "The part of the steps the base runs before the refiner continues (1 = no refiner)",
            step=0.05,
            elem_id="refiner-switch",
            group="refiner",
        ),
    ),
    Field(
        "aesthetic_score",
        "float",
        "the refiner's aesthetic score (its 5th time id, diffusers' 6)",
        6.0,
        low=0.0,
        high=10.0,
        called="aesthetic_score",
        label="Aesthetic score",
        needs="refiner",
        flag="--aesthetic-score",
        api_type=float,
        control=Control(
            "Aesthetic score",
            "The refiner's aesthetic conditioning, {low:g} to {high:g}",
            step=0.5,
            elem_id="aesthetic-score",
            group="refiner",
        ),
    ),
    Field(
        "negative_aesthetic_score",
        "float",
        "the refiner's aesthetic score for the negative prompt (diffusers' 2.5)",
        2.5,
        low=0.0,
        high=10.0,
        called="negative_aesthetic_score",
        label="Negative aesthetic score",
        needs="refiner",
        flag="--negative-aesthetic-score",
        api_type=float,
        control=Control(
            "Negative aesthetic score",
            "The refiner's aesthetic conditioning of the negative prompt",
            step=0.5,
            elem_id="negative-aesthetic-score",
            group="refiner",
        ),
    ),
    Field(
        "clip_skip",
        "int",
        "the text encoders' layer the UNet reads: 0 = SDXL's own (the penultimate), N = N "
        "layers before it (diffusers' clip_skip; A1111's Clip skip N + 2)",
        0,
        low=0,
        high=10,
        called="clip_skip",
        low_note=" (SDXL's penultimate layer)",
        label="Clip skip",
        label_offset=2,
        status="clip skip",
        flag="--clip-skip",
        api_type=int,
        control=Control(
            "CLIP skip",
            "0 = SDXL's own layer (the penultimate); N = N layers before it (A1111's Clip skip N + 2)",
            elem_id="clip-skip",
            group="style",
        ),
    ),
    Field(
        "hires_scale",
        "float",
        "hires fix: draw at the size, upscale by one of the server's --hires-scales and "
        "redraw (A1111's Upscale by; 1 = off)",
        1.0,
        low=1.0,
        high=MAX_SCALE,
        called="hires_scale",
        high_note=" (one of the server's --hires-scales; 1 = off)",
        label="Hires upscale",
        status="hires ×",
        needs="hires",
        flag="--hires-scale",
        api_type=float,
        control=Control(
            "Upscale by",
            "Off = no second pass; ×N: drawn at the size, upscaled N times and redrawn "
            "(the scales this server compiled)",
            step=0.25,
            elem_id="hires-scale",
            group="hires",
        ),
    ),
    Field(
        "hires_steps",
        "int",
        "hires fix: the second pass's steps (0 = as many as the first pass)",
        0,
        low=0,
        high=100,
        called="hires_steps",
        low_note=" (as the first pass)",
        label="Hires steps",
        needs="hires",
        flag="--hires-steps",
        api_type=int,
        control=Control(
            "Hires steps",
            "0 = as many as the first pass; they run on a schedule of steps ÷ denoise",
            elem_id="hires-steps",
            group="hires",
        ),
    ),
    Field(
        "hires_denoise",
        "float",
        "hires fix: how much of the upscaled picture is redrawn (A1111's Denoising strength)",
        0.55,
        low=0.01,
        high=1.0,
        called="hires_denoise",
        label="Denoising strength",
        needs="hires",
        flag="--hires-denoise",
        api_type=float,
        control=Control(
            "Denoising strength",
            "How much of the upscaled picture the second pass redraws",
            step=0.01,
            elem_id="hires-denoise",
            group="hires",
        ),
    ),
    Field(
        "hires_upscaler",
        "choice",
        "hires fix: how the picture is upscaled (Latent*: in latent space; Lanczos, "
        "Nearest: decoded, resized, encoded)",
        "Latent",
        choices=UPSCALERS,
        called="hires upscaler",
        label="Hires upscaler",
        needs="hires",
        flag="--hires-upscaler",
        api_type=str,
        control=Control("Upscaler", elem_id="hires-upscaler", group="hires"),
    ),
    Field(
        "outpaint",
        "text",
        "outpainting: pixels to add on each side, e.g. 'left=128 right=128' (left, right, up, down): the size is the "
        "grown canvas, the picture fitted into the rest and kept exactly",
        "",
        flag="--outpaint",
        api_type=str,
    ),
    Field(
        "mask_blur",
        "int",
        "with outpainting, inpaint only masked or the overlay: the mask's soft edge in pixels (A1111's Mask blur)",
        4,
        low=0,
        high=64,
        called="mask_blur",
        label="Mask blur",
        needs="mask",
        flag="--mask-blur",
        api_type=int,
        control=Control(
            "Mask blur",
            "The soft edge, in pixels, where the redrawn part meets the kept picture",
            elem_id="mask-blur",
            group="mask",
        ),
    ),
    Field(
        "inpaint_area",
        "choice",
        "inpainting: the whole picture at the size, or only the masked area (its box plus only_masked_padding, "
        "scaled to the size, inpainted there and pasted back)",
        "Whole picture",
        choices=("Whole picture", "Only masked"),
        choice_aliases=(("whole", "Whole picture"), ("only_masked", "Only masked")),
        called="inpaint_area",
        label="Inpaint area",
        needs="mask",
        flag="--inpaint-area",
        api_type=str,
        control=Control(
            "Inpaint area",
            "Only masked: the masked area and some pixels around it redrawn at the whole size, then pasted back",
            elem_id="inpaint-area",
            group="mask",
        ),
    ),
    Field(
        "only_masked_padding",
        "int",
        "inpaint only masked: pixels around the masked area's box that are cropped with it (A1111's Only masked "
        "padding)",
        32,
        low=0,
        high=256,
        called="only_masked_padding",
        label="Masked area padding",
        needs="mask",
        flag="--only-masked-padding",
        api_type=int,
        control=Control(
            "Only masked padding, pixels",
            "Pixels around the masked area cropped with it",
            elem_id="only-masked-padding",
            group="mask",
        ),
    ),
    Field(
        "inpaint_overlay",
        "choice",
        "inpainting the whole picture: 'on' pastes the picture back outside the (blurred) mask, as A1111 does; "
        "'off' returns diffusers' output",
        "off",
        choices=("off", "on"),
        called="inpaint_overlay",
        label="Inpaint overlay",
        needs="mask",
        flag="--inpaint-overlay",
        api_type=str,
        control=Control(
            "Paste the picture back",
            "On: the kept part comes back exactly, as A1111 does; off: diffusers' output",
            elem_id="inpaint-overlay",
            group="mask",
        ),
    ),
    Field(
        "pag_scale",
        "float",
        "perturbed-attention guidance on the UNet's middle block, with the server's --pag (0 = off; one more UNet "
        "batch per step); not with deepcache, ControlNets or regions, and the refiner's steps run without it (no "
        "programs compiled for those)",
        0.0,
        low=0.0,
        high=10.0,
        called="pag_scale",
        low_note=" (off)",
        label="PAG scale",
        status="PAG",
        needs="pag",
        flag="--pag-scale",
        api_type=float,
        control=Control(
            "PAG scale",
            "Perturbed-attention guidance: structure and detail, at one more UNet batch per step (0 = off). Not with "
            "DeepCache, ControlNet or regions; the refiner's steps run without it",
            step=0.1,
            elem_id="pag-scale",
            group="guidance",
        ),
    ),
    Field(
        "pag_adaptive_scale",
        "float",
        "PAG's scale lowered by this × (1000 − timestep), not below 0 (diffusers' pag_adaptive_scale; 0 = constant)",
        0.0,
        low=0.0,
        high=1.0,
        called="pag_adaptive_scale",
        label="PAG adaptive",
        needs="pag",
        flag="--pag-adaptive-scale",
        api_type=float,
        control=Control(
            "PAG adaptive scale",
            "0 = the same PAG scale on every step; above, less of it on the early (noisier) steps",
            step=0.001,
            elem_id="pag-adaptive-scale",
            group="guidance",
        ),
    ),
    Field(
        "freeu",
        "factors",
        "FreeU with the server's --freeu-programs: b1,b2,s1,s2 (SDXL's suggested 1.3,1.4,0.9,0.2; empty = off); not "
        "with deepcache, ControlNets or regions, and the refiner's steps run without it (no programs compiled for "
        "those)",
        "",
        low=0.0,
        high=10.0,
        called="freeu",
        label="FreeU",
        status="FreeU",
        needs="freeu",
        flag="--freeu",
        api_type=str,
        count=4,
        control=Control(
            "FreeU (b1,b2,s1,s2)",
            "Backbone and skip scales of the first two up blocks, e.g. SDXL's 1.3,1.4,0.9,0.2 (empty = off). Not "
            "with DeepCache, ControlNet or regions; the refiner's steps run without it",
            elem_id="freeu",
            group="guidance",
        ),
    ),
    Field(
        "regions",
        "regions",
        "regional prompts (Regional Prompter's Attention mode): each part of the prompt split on BREAK drawn in its "
        "region: 'columns 1,1', 'rows 1,2', 'columns 1,1;1,2,1' ('' = off; or region_mask)",
        "",
        flag="--regions",
        api_type=str,
    ),
    Field(
        "region_mask",
        "file",
        "regional prompts from a painted mask at the request's size: one colour per region on black, in the order "
        "the colours first appear row by row",
        flag="--region-mask",
        api_type=dict,
    ),
    Field(
        "region_base",
        "float",
        "regional prompts: the first part is the base, drawn everywhere at this share (0 = no base)",
        0.0,
        low=0.0,
        high=1.0,
        called="region_base",
        label="RP Base Ratio",
        needs="regions",
        flag="--region-base",
        api_type=float,
        control=Control(
            "Base ratio",
            "0 = every part is a region; r > 0: the first part is the base, r of it everywhere",
            step=0.05,
            elem_id="region-base",
            group="regions",
        ),
    ),
)
#: The table by name.
FIELD: Mapping[str, Field] = {row.name: row for row in FIELDS}
#: The plain fields (numbers and choices), in table order.
PLAIN: tuple[Field, ...] = tuple(row for row in FIELDS if row.plain)
