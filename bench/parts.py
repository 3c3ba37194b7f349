"""Running the bench's parts in turn: a part that fails is recorded with its error, and the next one runs.

A whole `python -m bench` takes many minutes, and one part can fail where the others do not (a measurement a loaded
machine defeats, a package a host lacks): the figures the other parts measured are still worth a results.json. The
failures are kept by part name, each as its error in one line and where it was raised, for results.json and
results.md; `python -m bench` then exits 1. (`python -m bench accelerator` goes on past a failed part too.)
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

from .common import Progress, progress

REPO = Path(__file__).resolve().parent.parent


def failure(exc: BaseException) -> dict:
    """What results.json keeps of a part's exception: its type and message, and the innermost line of this
    repository's code it came through (file:line in function), so a failure on another machine can be found."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [frame for frame in frames if Path(frame.filename).resolve().is_relative_to(REPO)]
    frame = (ours or frames or [None])[-1]
    at = None
    if frame is not None:
        path = Path(frame.filename).resolve()
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
        at = f"{name}:{frame.lineno} in {frame.name}"
    return {"error": f"{type(exc).__name__}: {exc}", "at": at}


def run_parts(parts: Iterable[tuple[str, Callable[[], object]]], say: Progress = progress) -> dict[str, dict]:
    """Call each (name, measure) in order; return {name: failure} of those that raised (empty when none did).

    An `Exception` ends its part only; KeyboardInterrupt and SystemExit still end the bench.
    """
    failed: dict[str, dict] = {}
    for name, measure in parts:
        try:
            measure()
        except Exception as exc:  # the bench's own report: what broke, then the remaining parts
            failed[name] = failure(exc)
            say(f"{name} failed: {failed[name]['error']} ({failed[name]['at']}); the next part runs")
    return failed
