"""The error types the stages raise, in one module no stage depends on, so no stage imports another for them."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message names the problem and what to do, in one line."""


class CheckpointError(ModelLoadError):
    """`--model` names no checkpoint (no such directory, a file, no model_index.json), or its files cannot be mapped
    onto SDXL's modules: bad input (the app and the CLI exit 2)."""


class InvalidInput(ValueError):
    """Bad user input; str(error) is one sentence fit to show to the user, no traceback needed."""
