"""Where the project keeps its caches on disk (converted checkpoints, compiled programs), without JAX."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_root() -> Path:
    """Per-user cache root of the project ($SDXL_JAX_CACHE, else $XDG_CACHE_HOME/sdxl-jax, else ~/.cache/sdxl-jax)."""
    if os.environ.get("SDXL_JAX_CACHE"):
        return Path(os.environ["SDXL_JAX_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "sdxl-jax"
