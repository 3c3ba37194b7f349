"""SDXL on JAX, the engine: load once, replicate over every device, compile once, one image per device per request.

    request (contract/request.py: every field, checked once where it enters)
      -> generator.py: tokens (host/planning/tokens.py) -> device arrays (device/sharding.py)
      -> host/loop.py: the compiled programs (host/compiling/programs.py over device/*) step by step
      -> pixels -> images with their parameters (contract/parameters.py)

Folders by role: `contract/` (the request and its rules, no JAX: what the page uses), `checkpoint/` (files ->
weights), `device/` (what runs on the accelerator, traced), `host/` (plans, programs, the loop), `cluster/` (several
processes). No Gradio here: the page is `web/`.
"""

import importlib

#: The package's names, by the module that holds them: imported when first asked for, so `import pipeline` (and
#: `python -m pipeline`, which imports this first) costs nothing; `pipeline/installed.py` runs on a bare Python.
_HOME = {
    "SDXL_BASE": "config",
    "TINY_MODEL": "config",
    "EngineConfig": "config",
    "CheckpointError": "contract.errors",
    "InvalidInput": "contract.errors",
    "ModelLoadError": "contract.errors",
    "Request": "contract.request",
    "RequestRules": "contract.request",
    "parse_request": "contract.request",
    "Generator": "generator",
    "GenerationResult": "generator",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # No side effect: a caller on a CPU-only machine that wants one device per core calls
    # `pipeline.platform.use_cpu_cores()` itself before the first JAX import, as app.py and the CLI do.
    return getattr(importlib.import_module(f".{home}", __name__), name)


__all__ = [
    "SDXL_BASE",
    "TINY_MODEL",
    "CheckpointError",
    "EngineConfig",
    "GenerationResult",
    "Generator",
    "InvalidInput",
    "ModelLoadError",
    "Request",
    "RequestRules",
    "parse_request",
]
