"""Style presets (the SDXL prompt templates the google/sdxl Space offered), read from assets/styles.json.

Kept free of JAX so the UI can import it without starting an accelerator runtime.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_STYLE",
    "DEFAULT_STYLES_PATH",
    "EXAMPLES_PATH",
    "PLACEHOLDER",
    "STYLE_NAMES",
    "Style",
    "StyleFileError",
    "apply_style",
    "load_examples",
    "load_styles",
]

ASSETS_DIR = pathlib.Path(__file__).resolve().parents[2] / "assets"
DEFAULT_STYLES_PATH = ASSETS_DIR / "styles.json"
EXAMPLES_PATH = ASSETS_DIR / "examples.json"

# The literal marker replaced by the user's prompt (never expanded with str.format, so braces in prompts are safe).
PLACEHOLDER = "{prompt}"
DEFAULT_STYLE = "No style"
# The shipped presets, in display order; tests check assets/styles.json against this.
STYLE_NAMES = (
    "No style",
    "Cinematic",
    "Photographic",
    "Anime",
    "Manga",
    "Digital Art",
    "Pixel art",
    "Fantasy art",
    "Neonpunk",
    "3D Model",
)


class StyleFileError(ValueError):
    """A styles file is missing, unreadable or malformed; the message names the file and the problem."""


@dataclass(frozen=True)
class Style:
    """One preset: wraps the user's prompt in a template and adds a negative prompt."""

    name: str  # shown in the UI dropdown and recorded in the PNG parameters
    prompt: str  # template containing PLACEHOLDER exactly once
    negative_prompt: str  # prepended to the user's negative prompt; may be ""


def apply_style(style: Style, prompt: str, negative_prompt: str) -> tuple[str, str]:
    """Return (styled prompt, combined negative prompt).

    A literal replace rather than str.format: a prompt like "a {cat}" must neither raise nor be altered.
    """
    styled = style.prompt.replace(PLACEHOLDER, prompt, 1)
    negative = ", ".join(part for part in (style.negative_prompt.strip(), negative_prompt.strip()) if part)
    return styled, negative


def unapply_style(style: Style, prompt: str, negative_prompt: str) -> tuple[str, str] | None:
    """The user's (prompt, negative prompt) that `apply_style(style, ...)` made these from, as an image's parameters
    write them (runs of spaces as one; `<lora:...>` tags added after the style's words stay at the end); None when
    the prompt was not made with this style's template."""
    before, _, after = (" ".join(part.split()) for part in style.prompt.partition(PLACEHOLDER))
    prompt = " ".join(prompt.split())
    added = re.search(r"(?:\s*<lora:[^<>]*>)+$", prompt) if after else None
    tags, core = (added.group(0).strip(), prompt[: added.start()]) if added else ("", prompt)
    if not (core.startswith(before) and core.endswith(after)) or len(core) < len(before) + len(after):
        return None
    user = core[len(before) : len(core) - len(after)].strip()
    style_negative = " ".join(style.negative_prompt.split())
    negative = " ".join(negative_prompt.split())
    if style_negative and negative.startswith(style_negative):
        negative = negative[len(style_negative) :].lstrip(", ").strip()
    return " ".join(part for part in (user, tags) if part), negative


def _parse_styles(data: object, source: str) -> dict[str, Style]:
    """Check the decoded JSON so a bad edit fails at startup with a precise message, not mid-request."""
    if not isinstance(data, list) or not data:
        raise StyleFileError(f"{source}: expected a non-empty JSON list of styles.")
    styles: dict[str, Style] = {}
    for index, entry in enumerate(data):
        where = f"{source}: style #{index + 1}"
        if not isinstance(entry, dict):
            raise StyleFileError(f"{where} must be an object with name, prompt and negative_prompt.")
        missing = [key for key in ("name", "prompt", "negative_prompt") if key not in entry]
        if missing:
            raise StyleFileError(f"{where} is missing {', '.join(missing)}.")
        extra = sorted(set(entry) - {"name", "prompt", "negative_prompt"})
        if extra:
            raise StyleFileError(f"{where} has unknown keys: {', '.join(extra)}.")
        name, prompt, negative = entry["name"], entry["prompt"], entry["negative_prompt"]
        if not all(isinstance(value, str) for value in (name, prompt, negative)):
            raise StyleFileError(f"{where}: name, prompt and negative_prompt must all be strings.")
        if not name.strip() or name != name.strip():
            raise StyleFileError(f"{where}: name must be non-empty without surrounding spaces; got {name!r}.")
        if name in styles:
            raise StyleFileError(f"{source}: duplicate style name {name!r}.")
        if prompt.count(PLACEHOLDER) != 1:
            raise StyleFileError(f"{source}: style {name!r} prompt must contain {PLACEHOLDER} exactly once.")
        if PLACEHOLDER in negative:
            raise StyleFileError(f"{source}: style {name!r} negative_prompt must not contain {PLACEHOLDER}.")
        styles[name] = Style(name=name, prompt=prompt, negative_prompt=negative)
    first = next(iter(styles))
    if first != DEFAULT_STYLE:
        raise StyleFileError(f"{source}: the first style must be {DEFAULT_STYLE!r}; got {first!r}.")
    if styles[DEFAULT_STYLE].prompt != PLACEHOLDER or styles[DEFAULT_STYLE].negative_prompt:
        raise StyleFileError(f"{source}: {DEFAULT_STYLE!r} must be {PLACEHOLDER!r} with an empty negative prompt.")
    return styles


def load_styles(path: str | pathlib.Path | None = None) -> dict[str, Style]:
    """Read and validate a styles file (default: assets/styles.json); insertion order is the display order."""
    if path is None:
        return dict(_default_styles())
    return _read_styles(pathlib.Path(path))


@functools.cache
def _default_styles() -> dict[str, Style]:
    """Cache the shipped file: validate_request may call load_styles on every request."""
    return _read_styles(DEFAULT_STYLES_PATH)


def _read_styles(path: pathlib.Path) -> dict[str, Style]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise StyleFileError(f"Cannot read styles file {path}: {error.strerror or error}.") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise StyleFileError(f"{path} is not valid JSON: {error.msg} at line {error.lineno}.") from error
    return _parse_styles(data, str(path))


def load_examples(path: str | pathlib.Path | None = None) -> list[str]:
    """Read the example prompts shown under the prompt box (a JSON list of non-empty strings)."""
    path = pathlib.Path(path) if path is not None else EXAMPLES_PATH
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise StyleFileError(f"Cannot load examples from {path}: {error}.") from error
    if not isinstance(data, list) or not all(isinstance(item, str) and item.strip() for item in data):
        raise StyleFileError(f"{path}: expected a JSON list of non-empty strings.")
    return list(data)
