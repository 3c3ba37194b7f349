"""SDXL on JAX: load once, replicate over every device, compile once, one image per device.

The chain, one module each: loading -> sharding -> text (tokenize, encode) -> diffusion (denoising loop, VAE
decode) -> images (PNG with parameters); `generator.Generator` wires them into one compiled program.
"""

from .errors import CheckpointError, ModelLoadError
from .settings import SDXL_BASE, TINY_MODEL, EngineConfig
from .validation import InvalidInput


def __getattr__(name: str):
    # Generator imports JAX; keep `import pipeline` light for UI code that only needs validation and styles.
    if name in ("Generator", "GenerationResult"):
        from . import generator

        return getattr(generator, name)
    raise AttributeError(name)


__all__ = [
    "SDXL_BASE",
    "CheckpointError", "TINY_MODEL", "EngineConfig", "GenerationResult", "Generator", "InvalidInput", "ModelLoadError"]
