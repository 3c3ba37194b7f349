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

from .errors import InvalidInput
from .styles import DEFAULT_STYLE

Size = tuple[int, int]  # (height, width)

MAX_PROMPT_CHARS = 2000
#: The engine takes prompts after a style template was applied, which adds a few hundred characters.
STYLED_MAX_CHARS = 2 * MAX_PROMPT_CHARS
GUIDANCE_MIN, GUIDANCE_MAX = 0.0, 20.0
SEED_MAX = 2**32 - 1
#: Most denoising steps a request may ask for (the page's slider goes this far).
MAX_STEPS = 100

# Longest slice of user input quoted back in a message; keeps errors readable and avoids reflecting big payloads.
_ECHO_CHARS = 40
# Inputs this many times over the cap are rejected before cleaning, so a huge paste costs no per-character work.
_RAW_FACTOR = 10
# Unicode categories removed outright: control, format (zero-width, bidi overrides) and lone surrogates,
# which cannot be encoded to UTF-8 and would break tokenizers and PNG text chunks.
_DROP_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})


def _echo(value: object) -> str:
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


def check_guidance(value: object) -> float:
    """Return the guidance scale as a float; numbers only (no strings, no bools), finite and within range."""
    allowed = f"Guidance scale must be a number between {GUIDANCE_MIN:g} and {GUIDANCE_MAX:g}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(f"{allowed}; got {_echo(value)}.")
    try:
        number = float(value)
    except (OverflowError, ValueError) as error:
        raise InvalidInput(f"{allowed}; got {_echo(value)}.") from error
    if not math.isfinite(number) or not GUIDANCE_MIN <= number <= GUIDANCE_MAX:
        raise InvalidInput(f"{allowed}; got {_echo(value)}.")
    return number


def resolve_seed(seed: object, randomize: bool = False) -> int:
    """Return the seed to use: a fresh random one if asked, else the given whole number in 0..SEED_MAX.

    Floats with an integral value are accepted because Gradio's Number component sends floats.
    """
    if randomize:
        return secrets.randbelow(SEED_MAX + 1)
    message = f"Seed must be a whole number from 0 to {SEED_MAX}; got {_echo(seed)}."
    if isinstance(seed, bool):
        raise InvalidInput(message)
    if isinstance(seed, numbers.Integral):
        number = int(seed)
    elif isinstance(seed, numbers.Real):
        as_float = float(seed)
        if not math.isfinite(as_float) or not as_float.is_integer():
            raise InvalidInput(message)
        number = int(as_float)
    elif isinstance(seed, str):
        digits = seed.strip()
        if not digits.isascii() or not digits.isdigit() or len(digits) > 20:
            raise InvalidInput(message)
        number = int(digits)
    else:
        raise InvalidInput(message)
    if not 0 <= number <= SEED_MAX:
        raise InvalidInput(message)
    return number


def check_style(name: object, styles: Mapping[str, object]) -> str:
    """Return the style name if it is one of the presets; None (a cleared dropdown) means the default style."""
    if name is None:
        name = DEFAULT_STYLE
    if isinstance(name, str) and name in styles:
        return name
    choices = ", ".join(styles)
    raise InvalidInput(f"Unknown style {_echo(name)}; choose one of: {choices}.")


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
    got = _size_text(_echo(height), _echo(width))
    if not sizes:
        raise InvalidInput(f"This server has no compiled image size that matches; got {got}.")
    compiled = " or ".join(_size_text(*size) for size in sizes)
    raise InvalidInput(f"This server compiled {compiled} only; got {got}.")


def check_steps(value: object, maximum: int = MAX_STEPS, message: str = "") -> int:
    """Denoising steps as an int in 1..maximum; whole-valued floats pass (Gradio's slider may send 30.0)."""
    message = message or f"Steps must be a whole number from 1 to {maximum}; got {_echo(value)}."
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(message)
    number = float(value)
    if not math.isfinite(number) or not number.is_integer() or not 1 <= number <= maximum:
        raise InvalidInput(message)
    return int(number)


def check_choice(value: object, choices: Iterable[str], field: str) -> str:
    """`value` as spelled in `choices` (case and surrounding spaces ignored); one line listing them otherwise."""
    options = list(choices)
    if isinstance(value, str):
        for option in options:
            if value.strip().lower() == option.lower():
                return option
    raise InvalidInput(f"Unknown {field} {_echo(value)}; choose one of: {', '.join(options)}.")


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
    shown = value if isinstance(value, str) else type(value).__name__
    if isinstance(shown, str) and len(shown) > 40:
        shown = shown[:39] + "…"
    offered = ", ".join(f"{w}×{h}" for h, w in sizes)
    raise InvalidInput(f"Aspect ratio {shown!r} is not offered by this server; choose one of: {offered} (or its "
                       f"ratio, e.g. 1:1).")


#: DeepCache intervals offered per request: 1 = off (the default), up to this many steps per whole-UNet step.
MAX_DEEPCACHE = 5
#: Defaults: both levers off (each changes the picture).
DEFAULT_CFG_END = 1.0
DEFAULT_DEEPCACHE = 1


def check_cfg_end(value: object) -> float:
    """`cfg_end` (guidance on the first ⌈f × steps⌉ steps) as a float in (0, 1]; one sentence otherwise."""
    message = f"cfg_end must be a number above 0 and at most 1 (1 = guidance on every step); got {_echo(value)}."
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInput(message)
    number = float(value)
    if not math.isfinite(number) or not 0 < number <= 1:
        raise InvalidInput(message)
    return number


def check_deepcache(value: object) -> int:
    """`deepcache` (DeepCache's interval N) as a whole number in 1..MAX_DEEPCACHE; one sentence otherwise."""
    return check_steps(
        value, MAX_DEEPCACHE,
        f"deepcache must be a whole number from 1 (off) to {MAX_DEEPCACHE} (the whole UNet every N steps); "
        f"got {_echo(value)}.",
    )  # fmt: skip
