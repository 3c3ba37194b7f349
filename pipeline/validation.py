"""One validation layer shared by the CLI, the Gradio app and the engine.

Every rejection is an InvalidInput whose message is a single readable sentence (what is wrong, what is allowed),
so the UI can show str(error) as-is. Kept free of JAX so the UI can import it cheaply.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import re
import secrets
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline.styles import DEFAULT_STYLE, Style, apply_style, load_styles

__all__ = [
    "GUIDANCE_MAX",
    "GUIDANCE_MIN",
    "MAX_PROMPT_CHARS",
    "SEED_MAX",
    "STYLED_MAX_CHARS",
    "InvalidInput",
    "PromptFilter",
    "Request",
    "check_choice",
    "check_guidance",
    "check_shape",
    "check_steps",
    "check_style",
    "clean_text",
    "resolve_seed",
    "validate_request",
]

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


class InvalidInput(ValueError):
    """Bad user input; str(error) is one sentence fit to show to the user, no traceback needed."""


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


def check_steps(value: object, maximum: int = MAX_STEPS) -> int:
    """Denoising steps as an int in 1..maximum; whole-valued floats pass (Gradio's slider may send 30.0)."""
    message = f"Steps must be a whole number from 1 to {maximum}; got {_echo(value)}."
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


@dataclass(frozen=True)
class Request:
    """A fully checked generation request: everything the engine needs, nothing left to validate."""

    prompt: str  # the user's prompt after clean_text (before the style template)
    negative_prompt: str  # the user's negative prompt after clean_text (before the style's negative)
    style: str  # a name present in the styles mapping
    guidance_scale: float  # finite, within [GUIDANCE_MIN, GUIDANCE_MAX]
    seed: int  # in 0..SEED_MAX; already randomised if the user asked for it
    styled_prompt: str = ""  # the prompt with the style template applied: what the engine should encode
    styled_negative_prompt: str = ""  # the style's negative joined with the user's: what the engine should encode


class PromptFilter:
    """An optional deny-list for prompts, off unless a file is given (see assets/blocked_words.example.txt).

    Matches whole words case-insensitively, so "ass" does not block "class"; a phrase matches across any whitespace.
    """

    MESSAGE = "This prompt contains a blocked word; please rephrase it."

    def __init__(self, words: Iterable[str]) -> None:
        terms = sorted({" ".join(word.casefold().split()) for word in words} - {""}, key=len, reverse=True)
        self.words: tuple[str, ...] = tuple(terms)  # the normalised (casefolded) terms
        alternatives = [r"\s+".join(re.escape(part) for part in term.split(" ")) for term in terms]
        # (?<!\w)/(?!\w) rather than \b, so terms that start or end with punctuation still match as whole words.
        self._pattern = re.compile(rf"(?<!\w)(?:{'|'.join(alternatives)})(?!\w)") if alternatives else None

    @classmethod
    def from_file(cls, path: str | pathlib.Path) -> PromptFilter:
        """Load one word or phrase per line (UTF-8); lines starting with '#' and blank lines are ignored."""
        text = pathlib.Path(path).read_text(encoding="utf-8-sig")
        lines = (line.strip() for line in text.splitlines())
        return cls(line for line in lines if line and not line.startswith("#"))

    def __len__(self) -> int:
        return len(self.words)

    def blocks(self, text: str) -> bool:
        """True if text contains any listed word or phrase as a whole word."""
        return self._pattern is not None and self._pattern.search(text.casefold()) is not None

    def check(self, text: str) -> None:
        """Raise InvalidInput (without naming the word) if the text contains a blocked term."""
        if self.blocks(text):
            raise InvalidInput(self.MESSAGE)


def validate_request(
    prompt: object,
    negative_prompt: object = "",
    style: object = DEFAULT_STYLE,
    guidance_scale: object = 5.0,
    seed: object = 0,
    randomize_seed: bool = False,
    styles: Mapping[str, Style] | None = None,
    prompt_filter: PromptFilter | None = None,
) -> Request:
    """Apply every check in one place, in the order a user would fix them, and return a Request.

    The filter sees only the user's prompt: style templates and negative prompts are not the user's request.
    """
    styles = load_styles() if styles is None else styles
    text = clean_text(prompt, field="prompt")
    if not text:
        raise InvalidInput("Please enter a prompt.")
    negative = clean_text(negative_prompt, field="negative prompt")
    style_name = check_style(style, styles)
    if prompt_filter is not None:
        prompt_filter.check(text)
    guidance = check_guidance(guidance_scale)
    resolved_seed = resolve_seed(seed, randomize=bool(randomize_seed))
    preset = styles[style_name]
    if isinstance(preset, Style):
        styled, styled_negative = apply_style(preset, text, negative)
    else:
        styled, styled_negative = text, negative
    return Request(
        prompt=text,
        negative_prompt=negative,
        style=style_name,
        guidance_scale=guidance,
        seed=resolved_seed,
        styled_prompt=" ".join(styled.split()),
        styled_negative_prompt=" ".join(styled_negative.split()),
    )
