"""Presets: named recipes (model, UNet file, steps, sampler, spacing, guidance, size) from assets/presets.json.

    python -m pipeline generate --preset lightning-4step --prompt "..." --out out/
    python app.py --preset turbo --model tiny        # a preset's sampler settings on the offline tiny checkpoint

Explicit flags override the preset. With `--model tiny` a preset applies only its sampler settings (steps, spacing,
sampler, CFG on/off, guidance), so every preset runs offline; size stays the tiny default.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass
from pathlib import Path

from .loading import ModelLoadError
from .samplers import SamplerConfig
from .settings import TINY_MODEL
from .validation import InvalidInput

PRESETS_PATH = Path(__file__).resolve().parent.parent / "assets" / "presets.json"


@dataclass(frozen=True)
class Preset:
    """One recipe; every field but guidance_scale is static (it selects the compiled program)."""

    name: str  # e.g. "lightning-4step"
    description: str  # one line for the header and --help
    model: str  # Hub id of the base checkpoint
    unet: str | None  # static: whole-UNet .safetensors swapped in (REPO:FILE), or None
    steps: int  # static: denoising steps
    sampler: str  # static: "euler" or "euler_ancestral"
    timestep_spacing: str  # static: "leading", "linspace" or "trailing"
    cfg: bool  # static: classifier-free guidance on/off
    guidance_scale: float  # the default guidance (traced; ignored when cfg is off)
    height: int  # static: image height
    width: int  # static: image width


def load_presets(path: str | Path = PRESETS_PATH) -> dict[str, Preset]:
    """Every preset of `path`, checked: a malformed entry fails in one line naming it."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"Could not read presets from {path} ({exc.__class__.__name__}).") from None
    fields = {f.name for f in dataclasses.fields(Preset)} - {"name"}
    presets = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or set(entry) != fields:
            got = set(entry) if isinstance(entry, dict) else set()
            problem = ", ".join(sorted(fields - got) or sorted(got - fields)) or "not an object"
            raise InvalidInput(f"Preset {name!r} in {path} is malformed ({problem}).")
        preset = Preset(name=name, **entry)
        SamplerConfig(sampler=preset.sampler, timestep_spacing=preset.timestep_spacing, cfg=preset.cfg)  # checks
        presets[name] = preset
    return presets


def get_preset(name: str, path: str | Path = PRESETS_PATH) -> Preset:
    presets = load_presets(path)
    if name not in presets:
        raise InvalidInput(f"Unknown preset {name!r}; choose one of: {', '.join(presets)}.")
    return presets[name]


def unet_supported() -> bool:
    """Whether this build can swap in a UNet file (`Generator.from_pretrained(unet=...)`, PyTorch checkpoints)."""
    from .generator import Generator

    return "unet" in inspect.signature(Generator.from_pretrained).parameters


def resolve(preset: Preset, *, model: str | None = None, **explicit) -> dict:
    """Generator settings for `preset`, explicit values (not None) winning; plus "guidance_scale" (a default).

    With model "tiny" only the sampler settings apply. A preset that needs a UNet file fails in one line when this
    build cannot load one.
    """
    tiny = (model or "").strip() == TINY_MODEL
    settings: dict = {
        "model": model or preset.model,
        "steps": preset.steps,
        "sampler": preset.sampler,
        "timestep_spacing": preset.timestep_spacing,
        "cfg": preset.cfg,
        "guidance_scale": preset.guidance_scale,
        "preset": preset.name,
    }
    if not tiny:
        settings.update(height=preset.height, width=preset.width)
        if preset.unet:
            if not unet_supported():
                raise ModelLoadError(
                    f"Preset {preset.name} needs its UNet file {preset.unet}, and this build cannot load UNet files "
                    "(PyTorch checkpoint support); use --model tiny to try its sampler settings."
                )
            settings["unet"] = preset.unet
    settings.update({key: value for key, value in explicit.items() if value is not None})
    return settings
