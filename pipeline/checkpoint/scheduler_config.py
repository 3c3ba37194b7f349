"""The checkpoint's scheduler config, read whole from its own file (the samplers read every field they honour)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..errors import InvalidInput

logger = logging.getLogger(__name__)


def read_scheduler_config(source: str, revision: str | None = None, fallback: dict | None = None) -> dict:
    """The checkpoint's `scheduler/scheduler_config.json` whole (local directory or Hub cache), else `fallback`.

    Read from the local cache only: the loader has just fetched the checkpoint, so this never touches the network.
    `fallback`: what the loader read from the same file (`checkpoint/networks.Networks.scheduler_config`).
    """
    path = Path(source) / "scheduler" / "scheduler_config.json"
    try:
        if not path.is_file():
            from huggingface_hub import hf_hub_download

            from .loading import default_revision

            path = Path(
                hf_hub_download(
                    source, "scheduler/scheduler_config.json", revision=revision or default_revision(source),
                    local_files_only=True,
                )
            )  # fmt: skip
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
        return config
    except Exception as exc:  # not cached, not JSON...: the loader's copy is next best
        if fallback is None:
            raise InvalidInput(f"Could not read the scheduler config of {source} ({exc.__class__.__name__}).") from None
        logger.warning("could not read %s (%s); using the loader's copy of it", path, exc.__class__.__name__)
        return dict(fallback)
