"""What the page says: its title, header and footer texts, the model's card, and the status line's pieces.

The texts live in assets/ (header.md, footer*.md) with $placeholders filled here; nothing here imports Gradio.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import string

from pipeline.config import SDXL_BASE
from pipeline.contract.engine import Engine
from pipeline.contract.parameters import model_name, unet_name
from pipeline.service.info import is_test_model

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
CSS_PATH = ASSETS / "style.css"
PAGE_JS = ASSETS / "page.js"  # run when the page loads: says when a slider's typed number was out of range
HEADER_PATH = ASSETS / "header.md"
FOOTER_PATH = ASSETS / "footer.md"  # SDXL base 1.0: its licence
FOOTER_TINY_PATH = ASSETS / "footer-tiny.md"  # the random-weight test model
FOOTER_OTHER_PATH = ASSETS / "footer-other.md"  # any other checkpoint: its own card and licence apply
#: Logged at start-up (for whoever runs the server) when a real model runs on JAX's CPU backend.
CPU_NOTICE = (
    "⚠️ No GPU or TPU found: this runs on the CPU, where one request takes many minutes. "
    'On GPU hardware install `jax[cuda12]==0.10.2` (README, "Deploy").'
)

#: What visitors see instead: short, nothing for them to install.
CPU_VISITOR_NOTICE = "Running on a CPU: each request takes many minutes."
#: The UNet size from which the CPU note is shown (a 25th of SDXL's 2.57 B parameters): a request's time grows with
#: it, and the test-sized checkpoints (tiny, tests/fixtures/tiny-pt: a few million) answer in seconds on a CPU.
CPU_SLOW_UNET_PARAMETERS = 100_000_000

TITLE = "Stable Diffusion XL on JAX"
MODEL_CARD_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0"
LICENSE_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/LICENSE.md"
#: Link to the project's source shown in the header (omitted when empty); SDXL_PROJECT_URL overrides it.
PROJECT_URL = os.environ.get("SDXL_PROJECT_URL", "")
GENERATION_FAILED = "Generation failed on the server; please try again."
#: What a running or waiting request answers when the server is stopped (SIGTERM, Ctrl-C, `docker stop`).
SERVER_STOPPING = "The server is shutting down: this request was stopped{at}. Please try again in a moment."
#: What the page and the API say when the server runs the guidance-free program (--no-cfg or a few-step preset).
NO_CFG_NOTE = "this server runs without classifier-free guidance: the negative prompt and guidance scale are ignored"


def gallery_columns(count: int) -> int:
    """Columns for `count` images: a near-2:1 grid that divides evenly (8 -> 4x2, 4 -> 2x2, 16 -> 4x4)."""
    if count <= 3:
        return max(count, 1)
    if count == 4:
        return 2
    divisors = [c for c in range(2, 9) if count % c == 0]
    if not divisors:
        return min(count, 4)
    target = math.sqrt(2 * count)
    return min(divisors, key=lambda c: (abs(c - target), c))


def read_template(path: pathlib.Path, **values: object) -> str:
    """Fill $placeholders in a UI text file (string.Template, so braces and % in the text are left alone)."""
    return string.Template(path.read_text(encoding="utf-8")).safe_substitute({k: str(v) for k, v in values.items()})


def model_card_url(model: str) -> str:
    """The served model's card on the Hub; "" for the tiny test model and local directories (no card to link)."""
    model = model.strip()
    if model == SDXL_BASE:
        return MODEL_CARD_URL
    if is_tiny(model) or pathlib.Path(model).expanduser().exists() or model.count("/") != 1:
        return ""
    return f"https://huggingface.co/{model}"


#: Widest UNet block of a test-sized checkpoint: SDXL's are 320, 640 and 1280 channels; the tiny geometry's 32-64.
TINY_CHANNELS = 128


def is_tiny(model: str) -> bool:
    """`tiny`, or a directory holding the tiny checkpoint (the file make-tiny writes last marks it) or another test-
    sized one (tests/fixtures/tiny-pt: its UNet's blocks at most TINY_CHANNELS wide; random weights, fast on a CPU)."""
    model = model.strip()
    path = pathlib.Path(model).expanduser()
    if is_test_model(model):
        return True
    try:
        channels = json.loads((path / "unet" / "config.json").read_text(encoding="utf-8"))["block_out_channels"]
        return max(channels) <= TINY_CHANNELS
    except (OSError, ValueError, KeyError, TypeError):  # not a local checkpoint (a Hub id), or an odd config
        return False


def model_texts(
    model: str, on_cpu: bool, unet: str | None = None, unet_parameters: int | None = None
) -> dict[str, str]:
    """Header and footer lines that depend on the served model: only SDXL base is described as SDXL 1.0.

    Models and UNet files are named as the images' `parameters` name them (Hub id or file name, never a server path).
    The CPU note follows the model's size, `unet_parameters` (the engine's; without it, whether `model` is tiny).
    """
    model = model.strip()
    if is_tiny(model):
        footer, about = FOOTER_TINY_PATH, "Model: the tiny random-weight test model (its images are noise, on purpose)"
    else:
        footer = FOOTER_PATH if model == SDXL_BASE else FOOTER_OTHER_PATH
        about = "" if model == SDXL_BASE else f"Model: `{model_name(model)}`"
    if unet:
        about = f"{about} · UNet: `{unet_name(unet)}`" if about else f"UNet: `{unet_name(unet)}`"
    slow = not is_tiny(model) if unet_parameters is None else unet_parameters >= CPU_SLOW_UNET_PARAMETERS
    notice = CPU_VISITOR_NOTICE if on_cpu and slow else ""
    return {"footer_path": str(footer), "about": about, "notice": notice}


def header_links(model: str = SDXL_BASE) -> str:
    """Markdown links under the title: the model card and the project's source when PROJECT_URL is set ("" if none)."""
    card = model_card_url(model)
    links = [f"[Model card]({card})"] if card else []
    if PROJECT_URL:
        links.append(f"[Source code]({PROJECT_URL})")
    return " · ".join(links)


def sampler_summary(generator: Engine) -> str:
    """e.g. "preset lightning-4step: Euler, trailing spacing, no CFG" for the log and the advanced settings."""
    sampler = getattr(generator, "sampler", None)
    if sampler is None:
        return ""
    text = f"{sampler.label}, {sampler.timestep_spacing} spacing, {'CFG' if sampler.cfg else 'no CFG'}"
    preset = getattr(generator.config, "preset", None)
    return f"preset {preset}: {text}" if preset else text
