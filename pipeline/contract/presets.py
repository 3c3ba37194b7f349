"""Presets: named few-step recipes (model, UNet file, steps, sampler, spacing, guidance, size) from assets/presets.json.

    python -m pipeline generate --preset lightning-4step --prompt "..." --out out/
    python app.py --preset turbo --model tiny        # a preset's sampler settings on the offline tiny checkpoint

Explicit flags override the preset (`config.preset_settings`). With `--model tiny` (or any model other than the
preset's own) a preset applies only its sampler settings (steps, spacing, sampler, CFG on/off, guidance): the UNet
file and the size belong to the preset's model, so every preset also runs offline on the tiny checkpoint. Kept free
of JAX (the app imports it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import InvalidInput
from .sampler_names import SPACINGS, sampler_id

PRESETS_PATH = Path(__file__).resolve().parents[2] / "assets" / "presets.json"
#: Names, for --help and the argparse choices (the file is checked when a preset is used).
PRESET_NAMES = ("sdxl-base", "lightning-2step", "lightning-4step", "lightning-8step", "turbo", "lcm-lora-4step")


@dataclass(frozen=True)
class Preset:
    """One recipe; every field but guidance_scale is static (it selects the compiled program)."""

    name: str  # e.g. "lightning-4step"
    description: str  # one line for the header and --help
    model: str  # Hub id of the checkpoint the recipe was made for
    unet: str | None  # whole-UNet .safetensors swapped in (REPO:FILE, see convert.py), or None
    variant: str | None  # PyTorch weight variant to download, e.g. "fp16", or None
    steps: int  # static: denoising steps
    sampler: str  # static: "euler" or "euler_ancestral"
    timestep_spacing: str  # static: "leading", "linspace" or "trailing"
    cfg: bool  # static: classifier-free guidance on/off (off = the guidance-free program)
    guidance_scale: float  # the default guidance (traced; ignored when cfg is off)
    height: int  # static: image height of the recipe
    width: int  # static: image width of the recipe
    lora: str | None = None  # A1111's NAME:WEIGHT of a LoRA of --lora-dir the recipe needs (requests naming none)


def load_presets(path: str | Path = PRESETS_PATH) -> dict[str, Preset]:
    """Every preset of `path`, checked: a malformed entry fails in one line naming it."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"Could not read presets from {path} ({exc.__class__.__name__}).") from None
    if not isinstance(raw, dict):
        raise InvalidInput(f"Presets in {path} must be a JSON object of name -> preset.")
    fields = {f.name for f in dataclasses.fields(Preset)} - {"name"}
    required = {f.name for f in dataclasses.fields(Preset) if f.default is dataclasses.MISSING} - {"name"}
    presets = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not required <= set(entry) <= fields:
            got = set(entry) if isinstance(entry, dict) else set()
            problem = ", ".join(sorted(required - got) or sorted(got - fields)) or "not an object"
            raise InvalidInput(f"Preset {name!r} in {path} is malformed ({problem}).")
        preset = Preset(name=name, **entry)
        sampler_id(preset.sampler)  # one clear line on a bad value
        if preset.timestep_spacing not in SPACINGS:
            raise InvalidInput(
                f"Unsupported timestep spacing {preset.timestep_spacing!r}; choose one of: {', '.join(SPACINGS)}."
            )
        if not isinstance(preset.cfg, bool):
            raise InvalidInput(f"cfg must be true or false; got {preset.cfg!r}.")
        for key in ("steps", "height", "width"):
            value = getattr(preset, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(f"Preset {name!r} in {path}: {key} must be a positive whole number.")
        presets[name] = preset
    return presets


def lora_of(text: str) -> tuple[str, float]:
    """A preset's NAME:WEIGHT as (name, weight)."""
    name, _, weight = text.rpartition(":")
    return name, float(weight)


def get_preset(name: str, path: str | Path = PRESETS_PATH) -> Preset:
    """The preset called `name` (surrounding spaces and case ignored), or one line listing the choices."""
    presets = load_presets(path)
    key = str(name).strip().lower()
    if key not in presets:
        raise InvalidInput(f"Unknown preset {name!r}; choose one of: {', '.join(presets)}.")
    return presets[key]
