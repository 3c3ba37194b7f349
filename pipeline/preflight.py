"""The files a start-up's options name, checked before JAX is imported (app.py, `python -m pipeline generate`).

A wrong `--model` or `--lora-dir` then fails in one line within a second or two, where loading found it only after
JAX (and, in the app, Gradio) had been imported: 10-30 s. JAX-free: the checks read file names, JSON and safetensors
headers (`checkpoint/loading.resolve_model`, `checkpoint/lora.screen_lora_dir`), the same ones loading relies on.
"""

from __future__ import annotations

from .config import TINY_MODEL, EngineConfig


def check_model(config: EngineConfig) -> None:
    """Raise the one-line error of a model that cannot load: no such directory, a file, not SDXL, an absent variant.
    The tiny model is built when first loaded, not here: it is no path a user can get wrong."""
    from .checkpoint.loading import resolve_model

    if str(config.model).strip() != TINY_MODEL:
        resolve_model(config.model, config.variant)


def check_loras(config: EngineConfig) -> tuple[list[str], dict[str, str]]:
    """The LoRAs of `config.lora_dir` a load would offer and those it refuses (name -> why), from their headers;
    none without a folder. A folder that does not exist raises its one-line error."""
    if not config.lora_dir:
        return [], {}
    from .checkpoint.lora import screen_lora_dir

    return screen_lora_dir(config.lora_dir)
