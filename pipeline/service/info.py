"""`GET /v1/info`: what a page needs to build its form for an engine, and to tell engines apart.

Names, never server paths: a local model or UNet file is named by its folder or file name, as images name them.
"""

from __future__ import annotations

import importlib.metadata
import pathlib

from ..checkpoint.tiny import COMPLETE_MARKER
from ..config import TINY_MODEL
from ..contract.parameters import model_name, unet_name
from ..contract.request import MAX_LORAS, request_schema
from ..contract.sampler_names import SAMPLER_NAMES

#: The libraries whose versions an engine reports (two engines with different ones may give different pixels).
VERSIONED = ("jax", "jaxlib", "flax")
#: What engines must agree on for one page to offer one form (the page names the first difference at start-up).
MUST_AGREE = (
    "model",
    "unet",
    "sizes",
    "samplers",
    "sampler",
    "cfg",
    "levers",
    "loras",
    "default_loras",
    "embeddings",
    "controlnets",
    "union_controlnets",
    "ip_adapters",
    "ip_slots",
    "refiner",
    "hires_scales",
    "hires_upscalers",
    "num_images",
)


def is_test_model(model: str) -> bool:
    """`tiny`, or a directory holding the tiny checkpoint (the file make-tiny writes last marks it): random weights,
    what the page says of a test model (web/page/texts.py asks here, so the page needs nothing of checkpoint/)."""
    model = str(model).strip()
    return model == TINY_MODEL or (pathlib.Path(model).expanduser() / COMPLETE_MARKER).is_file()


def engine_info(generator, processes: int = 1) -> dict:
    """The info of a loaded, warmed-up `Generator` (on several processes: process 0's, for the whole slice)."""
    config, rules, sampler = generator.config, generator.rules, generator.sampler
    model = str(config.model).strip()
    return {
        "model": model_name(model),
        "test_model": is_test_model(model),
        "unet": unet_name(config.unet) or None,
        "unet_parameters": generator.unet_parameters,  # the page's CPU note follows the model's size
        "preset": getattr(config, "preset", None),
        "steps": config.steps,
        "sizes": [list(size) for size in rules.sizes],
        "sampler": rules.sampler,
        "samplers": list(SAMPLER_NAMES),
        "sampler_settings": {"label": sampler.label, "timestep_spacing": sampler.timestep_spacing, "cfg": sampler.cfg},
        "guidance_scale": rules.guidance_scale,
        "cfg": rules.cfg,
        "levers": rules.levers,
        "previews": bool(config.previews),
        "loras": list(rules.loras),
        "default_loras": [list(lora) for lora in rules.default_loras],
        "embeddings": list(rules.embeddings),
        "controlnets": list(rules.controlnets),
        "union_controlnets": list(rules.union_controlnets),  # those that are union models (a control_type per unit)
        "ip_adapters": list(rules.ip_adapters),  # the IP-Adapters an image prompt may name
        "ip_slots": rules.ip_slots,
        "refiner": rules.refiner or None,  # the --refiner's name (requests' refiner_switch), None without one
        "hires_scales": list(rules.hires_scales),  # the hires fix's scales (requests' hires_scale), [] without one
        "hires_upscalers": list(rules.hires_upscalers),  # its upscalers by name (requests' hires_upscaler)
        "max_loras": MAX_LORAS,
        "styles": list(rules.styles),
        "request_schema": request_schema(),
        "num_images": generator.num_images,
        "requests_at_once": generator.requests_at_once,  # 1; with --merge-requests, 2 × --images-per-device
        "device_count": generator.device_count,
        "device_kind": str(generator.device_kind),
        "device_summary": generator.device_summary,
        "processes": processes,
        "versions": {name: _version(name) for name in VERSIONED},
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def disagreement(first: dict, other: dict) -> str | None:
    """The first setting two engines' infos differ on, as words ("sizes: [[128, 128]] vs [[64, 64]]"), else None."""
    for key in MUST_AGREE:
        if first.get(key) != other.get(key):
            return f"{key}: {first.get(key)!r} vs {other.get(key)!r}"
    return None
