"""The `parameters` text (AUTOMATIC1111's infotext) and the status line: the one writer and the one reader.

The text uses the layout most image tools read (A1111's): the prompt (any number of lines), a "Negative prompt:" line
(and its continuation lines), then one settings line of "Key: value" pairs separated by commas, where a value holding
a comma, a colon or a quote is JSON-quoted (`Lora hashes: "add_detail: 7c6bad76eb54, grain: 0f3c2d1a9b77"`).

    text = describe(prompt=..., seed=..., ..., extra=written_settings(values, style=..., has_picture=...))
    info = parse_infotext(text)          # prompt, negative prompt, every pair of the settings line
    " · ".join(status_parts(values, started))   # the page's status line and a history entry's, from the same words

The reading follows A1111's own reader (`parse_generation_parameters` in `modules/infotext_utils.py`,
AUTOMATIC1111/stable-diffusion-webui): the last line is the settings line only when it holds at least three pairs;
"WxH" values give a width and a height. How the text travels in files (a PNG text chunk, EXIF UserComment) is
`image_files.py`'s; what a dropped picture fills in the form is web/page/png_info.py's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .controlnet_units import ControlUnit
from .fields import FIELDS, PLAIN
from .styles import DEFAULT_STYLE

#: --emphasis modes, A1111's "Original", "No norm" and "None" (brackets read as plain text).
EMPHASIS_MODES = ("original", "no-norm", "off")
#: A1111's names of the modes, as its `Emphasis` parameter writes them.
EMPHASIS_LABELS = {"original": "Original", "no-norm": "No norm", "off": "None"}

#: How the status line names a request that starts from a picture, by the history's name for it (web/page/form.py).
PICTURE_STATUS = {"inpainting": "inpainted", "image to image": "from a picture"}

#: Pairs the last line needs to count as the settings line (A1111's rule).
MIN_SETTINGS = 3
#: Keys whose values are numbers, with their type (anything else stays text, e.g. "Model hash: 1234567890"): the
#: request fields' labels (`fields.FIELDS`), then A1111's own.
NUMBER_KEYS = {
    **{
        row.label: int if row.kind in ("int", "seed") else float
        for row in FIELDS
        if row.label and row.kind in ("int", "seed", "float")
    },
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
    "Masked area padding": int,
}
#: A1111's ControlNet entry keys -> a unit's fields (what reading a "ControlNet N" entry gives back).
CONTROL_KEYS = {
    "Module": "module",
    "Model": "name",
    "Weight": "weight",
    "Guidance Start": "start",
    "Guidance End": "end",
    "Threshold A": "low",
    "Threshold B": "high",
    "Union Control Type": "control_type",  # sd-webui-controlnet's key for a union model's type
}

# One pair of the settings line: `Key: value` or `Key: "quoted, value"`, then a comma or the end. Anything else up to
# the next comma is a loose fragment (e.g. this app's "Sampler: Euler a, v-prediction"), kept with the value before.
_PAIR = re.compile(
    r'\s*(?:(?P<key>\w[\w \-/+.()]*?)\s*:\s*(?P<value>"(?:\\.|[^\\"])*"|[^,]*)|(?P<loose>[^,]*))\s*(?:,|$)'
)
_SIZE = re.compile(r"(\d{1,6})\s*x\s*(\d{1,6})")
_HASH_PAIR = re.compile(r"\s*([^:,]+?)\s*:\s*([^,]*?)\s*(?:,|$)")
_CONTROL_KEY = re.compile(r"ControlNet \d+")


# ---- writing ---------------------------------------------------------------------------------------------------


def model_name(model: str) -> str:
    """How outputs name a model: a Hub id or "tiny" as given, a local directory by its own name (never its path)."""
    model = str(model).strip()
    path = Path(model).expanduser()
    if model.count("/") == 1 and not model.startswith(("/", ".", "~")) and not path.exists():
        return model  # a Hub id: public already
    return path.name or path.resolve().name or "local model"


def unet_name(unet: str | None) -> str:
    """How outputs name a `--unet` file (a local path or REPO:FILE): by its file name alone, never a server path."""
    if not unet:
        return ""
    spec = str(unet).strip()
    if not Path(spec).expanduser().is_file() and re.fullmatch(r"[\w.-]+/[\w.-]+:.+", spec):
        spec = spec.partition(":")[2]
    return Path(spec).name


def describe(
    *,
    prompt: str,
    negative_prompt: str,
    seed: int,
    steps: int,
    guidance_scale: float,
    height: int,
    width: int,
    model: str,
    dtype: str,
    sampler: str = "Euler",
    spacing: str | None = None,
    unet: str | None = None,
    extra: dict[str, object] | None = None,
) -> str:
    """The `parameters` text of one image; `model` and `unet` are named as `model_name`/`unet_name` say (no paths).

    `extra`: more "Key: value" settings, after the others (what a request set beyond A1111's basics, e.g.
    "CFG end: 0.5", as `written_settings` gives them); a value with a comma or a colon is quoted, as A1111 quotes
    "Lora hashes".
    """
    lines = [prompt]
    if negative_prompt:
        lines.append(f"Negative prompt: {negative_prompt}")
    lines.append(
        f"Steps: {steps}, Sampler: {sampler}, CFG scale: {guidance_scale:g}, Seed: {seed}, Size: {width}x{height}, "
        f"Model: {model_name(model)}"
        + (f", UNet: {unet_name(unet)}" if unet else "")
        + f", Dtype: {dtype}"
        + (f", Timestep spacing: {spacing}" if spacing else "")
        + "".join(f", {key}: {_setting(value)}" for key, value in (extra or {}).items())
    )
    return "\n".join(lines)


def written_settings(
    values: Mapping[str, object],
    *,
    style: str,
    has_picture: bool,
    lora_hashes: str = "",
    text: Mapping[str, str] | None = None,
    controlnets: Sequence[ControlUnit] = (),
    mask: Mapping[str, object] | None = None,
    regions: tuple[str, str] | None = None,
    image_prompts: Sequence[tuple[str, str, float, float, float]] = (),
) -> dict[str, object]:
    """What a request set beyond A1111's basics, by `parameters` label, in the order A1111 writes them: the style
    (a reader can undo the styled prompt), a picture's own fields and how its mask was used (`mask`:
    `inpaint_modes.MaskUse.settings`), `Lora hashes`, what reading the prompts adds (`text_settings`), the table's
    other fields away from their default, the ControlNet units and the image prompts after them (`image_prompts`:
    (module, adapter, scale, start, end) each, written as sd-webui-controlnet writes an IP-Adapter unit), then the
    regional prompts (`regions`: the divide mode and ratios, `region_settings`).

    `values`: the request's table fields by name (`Request.plain_values()`)."""
    return {
        **({"Style": style} if style != DEFAULT_STYLE else {}),
        **table_settings(values, picture=True, has_picture=has_picture),
        **(mask or {}),
        **({"Lora hashes": lora_hashes} if lora_hashes else {}),
        **(text or {}),
        **table_settings(values, picture=False, has_picture=has_picture),
        **control_settings(controlnets),
        **image_prompt_settings(image_prompts, first=len(controlnets)),
        **(region_settings(*regions, values.get("region_base", 0.0)) if regions else {}),
    }


def region_settings(mode: str, ratios: str, base: float) -> dict[str, object]:
    """Regional Prompter's keys, as its infotext writes them: on, the divide mode (Columns, Rows, Mask), the
    ratios and the base ratio."""
    return {"RP Active": True, "RP Divide mode": mode, "RP Ratios": ratios or "-", "RP Base Ratio": base}


def table_settings(values: Mapping[str, object], *, picture: bool, has_picture: bool) -> dict[str, object]:
    """The table's fields beyond A1111's basics, by their `parameters` label: a picture's own (`picture`, written
    whenever the request has one: A1111 writes them among its keys), or the others away from their default."""
    written = {}
    hires = values.get("hires_scale", 1.0) != 1.0
    for row in PLAIN:
        if not row.label or row.basic or row.needs in ("mask", "regions") or (row.needs == "picture") != picture:
            continue
        value = values[row.name]
        if row.needs == "hires":  # A1111 writes its hires fix whole when on (its steps when set), nothing when off
            if hires and (row.name != "hires_steps" or value):
                written[row.label] = row.to_label(value)
        elif has_picture if picture else value != row.default:
            written[row.label] = row.to_label(value)
    return written


def hashes_field(used: Iterable[tuple[str, str]]) -> str:
    """A1111's `Lora hashes` / `TI hashes` value from (name, short hash) pairs: "name: hash, name2: hash2".

    A1111 drops ':' and ',' from names here (extra_networks_lora.py); `describe` quotes the whole value, since it
    holds commas (`Lora hashes: "a: 0123456789ab, b: ba9876543210"`).
    """
    return ", ".join(f"{name.translate(str.maketrans('', '', ':,'))}: {short}" for name, short in used)


def text_settings(embeddings: Sequence[tuple[str, str]], emphasis: str, emphasized: bool) -> dict[str, str]:
    """What reading a request's prompts adds: A1111's `TI hashes` for the embeddings it used ((name, short hash)
    pairs), and `Emphasis` when the server's mode is not A1111's default and a text has a bracket (`emphasized`)."""
    settings = {}
    if embeddings:
        settings["TI hashes"] = hashes_field(embeddings)
    if emphasis != "original" and emphasized:
        settings["Emphasis"] = EMPHASIS_LABELS[emphasis]
    return settings


def control_entry(unit: ControlUnit, index: int) -> tuple[str, str]:
    """A1111's ControlNet extension's `parameters` entry: ('ControlNet 0', 'Module: canny, Model: ...')."""
    text = (
        f"Module: {unit.module}, Model: {unit.name}, Weight: {unit.weight:g}, Guidance Start: {unit.start:g}, "
        f"Guidance End: {unit.end:g}"
    )
    if unit.module == "canny":
        text += f", Threshold A: {unit.low}, Threshold B: {unit.high}"
    if unit.module == "tile":  # A1111's tile_resample writes its rate as its Threshold A
        text += f", Threshold A: {unit.rate:g}"
    if unit.control_type:
        text += f", Union Control Type: {unit.control_type}"
    return f"ControlNet {index}", text  # describe() quotes it, as A1111 does a value with commas


def control_settings(units: Sequence[ControlUnit]) -> dict[str, str]:
    """A1111's ControlNet extension's `parameters` entries: {"ControlNet 0": "Module: canny, Model: ..."}."""
    return dict(control_entry(unit, i) for i, unit in enumerate(units))


def image_prompt_settings(prompts: Sequence[tuple[str, str, float, float, float]], first: int = 0) -> dict[str, str]:
    """Image prompts as sd-webui-controlnet writes its IP-Adapter units: {"ControlNet 1": "Module:
    ip-adapter_clip_sdxl, Model: ip-adapter_sdxl, Weight: 0.6, ..."}, numbered after the ControlNets (`first`)."""
    return {
        f"ControlNet {first + i}": f"Module: {module}, Model: {adapter}, Weight: {scale:g}, Guidance Start: "
        f"{start:g}, Guidance End: {end:g}"
        for i, (module, adapter, scale, start, end) in enumerate(prompts)
    }


def _setting(value: object) -> str:
    """A settings value as A1111 writes it: as is, or JSON-quoted when a comma or colon would split it."""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return json.dumps(text, ensure_ascii=False) if any(char in text for char in ',:"') else text


# ---- the status line -------------------------------------------------------------------------------------------


def status_size(size: tuple[int, int], final: tuple[int, int] | None = None, scale: float = 1.0) -> str:
    """The size the status line says: the images' (`final`, (height, width); `size` when not given), and with the
    hires fix on (`scale` above 1) the first pass's too, "256×256 (hires ×2 from 128×128)": the images are the
    larger size, while `parameters` says the first pass's as A1111 writes it (`Size: 128x128`)."""
    height, width = final or size
    if scale == 1.0:
        return f"{width}×{height}"
    return f"{width}×{height} (hires ×{scale:g} from {size[1]}×{size[0]})"


def status_steps(steps: int, hires_steps: int = 0) -> str:
    """The steps that ran as the status line and the history say them: "4 steps", or with the hires fix the first
    pass's and the second's, "4 + 4 steps" (`hires_steps`: the second pass's; 0 = no second pass)."""
    total = f"{steps} + {hires_steps}" if hires_steps else str(steps)
    return f"{total} step{'s' if steps + hires_steps != 1 else ''}"


def status_parts(values: Mapping[str, object], started: str | None, *, hires: bool = True) -> list[str]:
    """The table's fields as the status line and the history show them: those away from their default ("CFG end
    0.5", "schedule Karras"), and a picture's own when it `started` from one ("inpainted, strength 0.6"). One
    renderer, so the page's line and a history entry's never disagree. `hires=False`: the hires fix's scale is left
    out (the status line says it with the size: `status_size`)."""
    parts = []
    for row in PLAIN:
        value = values.get(row.name)
        if not row.status or value is None or (row.needs == "hires" and not hires):
            continue
        if row.needs == "picture":
            if started:
                parts.append(f"{started}, {row.status} {value:g}")
        elif value != row.default:
            parts.append(f"{row.status} {value}" if row.textual else f"{row.status} {value:g}")
    if regions := values.get("regions"):  # a regional prompt's divide syntax (a painted mask is not kept as text)
        base = values.get("region_base") or 0.0
        parts.append(f"regions {regions}" + (f", base {base:g}" if base else ""))
    return parts


# ---- reading ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Infotext:
    """A `parameters` text taken apart."""

    prompt: str  # the prompt lines (joined with newlines)
    negative_prompt: str  # after "Negative prompt:" ("" when absent)
    settings: dict[str, str] = field(default_factory=dict)  # every pair of the settings line, in order, unquoted


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


def typed(key: str, value: str):
    """A settings value as a Python value: numbers for `NUMBER_KEYS`, (width, height) for "WxH", {name: hash} for
    "... hashes" (e.g. "Lora hashes", "TI hashes"), a unit's fields for "ControlNet N" (`read_control_entry`), the
    text itself otherwise (and whenever it does not parse)."""
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
    if _CONTROL_KEY.fullmatch(key):
        return read_control_entry(text) or text
    return text


def read_control_entry(text: str) -> dict[str, object]:
    """An entry `control_entry` made (or A1111's extension: its extra keys are skipped) -> {name, module, weight,
    start, end[, low, high, rate, control_type]}; numbers as numbers. What PNG Info shows of a ControlNet (the map is
    not in the text)."""
    values: dict[str, object] = {}
    for part in str(text).split(","):
        key, sep, value = part.partition(":")
        field_name = CONTROL_KEYS.get(key.strip())
        if not sep or field_name is None:
            continue
        value = value.strip()
        try:
            values[field_name] = float(value) if field_name not in ("module", "name", "control_type") else value
        except ValueError:
            continue
    if values.get("module") == "tile" and "low" in values:  # tile's Threshold A is its rate
        values["rate"] = values.pop("low")
    return values


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
