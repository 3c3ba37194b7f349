"""The error types the stages raise, in one module no stage depends on, so no stage imports another for them."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message names the problem and what to do, in one line."""


class CheckpointError(ModelLoadError):
    """The checkpoint's files are there but cannot be mapped onto SDXL's modules (bad input: the CLI exits 2)."""


class InvalidInput(ValueError):
    """Bad user input; str(error) is one sentence fit to show to the user, no traceback needed."""
