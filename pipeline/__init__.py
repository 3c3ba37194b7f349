"""SDXL on JAX, the engine: load once, replicate over every device, compile once, one image per device per request.

    request (request.py: every field, checked once where it enters)
      -> generator.py: tokens (host/tokens.py) -> device arrays (cluster/arrays.py)
      -> host/loop.py: the compiled programs (host/programs.py over device/*) step by step
      -> pixels -> images with their parameters (host/images.py)

Folders by role: `checkpoint/` (files -> weights), `device/` (what runs on the accelerator, traced), `host/` (plans,
programs, the loop, images), `cluster/` (several processes). No Gradio here: the page is `web/`.
"""

from .config import SDXL_BASE, TINY_MODEL, EngineConfig
from .errors import CheckpointError, InvalidInput, ModelLoadError
from .request import Request, RequestRules, parse_request


def __getattr__(name: str):
    # Generator imports JAX; keep `import pipeline` light for code that only needs requests, options and styles.
    if name in ("Generator", "GenerationResult"):
        import sys

        if "jax" not in sys.modules:  # as the app and the CLI: one device per CPU core, no probe for an absent TPU
            from .platform import use_cpu_cores

            use_cpu_cores()
        from . import generator

        return getattr(generator, name)
    raise AttributeError(name)


__all__ = [
    "SDXL_BASE", "TINY_MODEL", "CheckpointError", "EngineConfig", "GenerationResult", "Generator", "InvalidInput",
    "ModelLoadError", "Request", "RequestRules", "parse_request",
]  # fmt: skip
