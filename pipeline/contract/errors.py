"""The error types the stages raise, in one module no stage depends on, so no stage imports another for them."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The checkpoint could not be loaded; the message names the problem and what to do, in one line."""


class CheckpointError(ModelLoadError):
    """`--model` names no checkpoint (no such directory, a file, no model_index.json), or its files cannot be mapped
    onto SDXL's modules: bad input (the app and the CLI exit 2)."""


class InvalidInput(ValueError):
    """Bad user input; str(error) is one sentence fit to show to the user, no traceback needed."""


class EngineUnavailable(RuntimeError):
    """No engine could run the request: the one running it stopped mid-request and none other could, or none was ready
    in time (a page in front of engine services). str(error) is one sentence fit to show to the user. Engines that die
    or restart are expected, not a bug: the page says the sentence and logs the traceback at DEBUG only."""
