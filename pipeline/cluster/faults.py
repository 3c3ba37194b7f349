"""How a multi-process run fails: one line and a known exit status, before JAX's own aborts (a C++ stack trace).

A collective stuck on a dead peer never returns, so every wait on the other processes runs under a `Deadline` that
exits the process; `fatal` leaves at once without atexit handlers (JAX's shutdown barrier would wait on the dead peer).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

from . import output

logger = logging.getLogger(__name__)

#: Exit status of a process that gave up on the cluster (a peer died, never joined, or a call overran).
EXIT_CLUSTER_FAILED = 4


def fatal(message: str) -> None:
    """One line on stderr, then leave at once: no atexit (JAX's shutdown barrier would wait on the dead peer)."""
    output.restore()  # what is still in the pipe comes out first
    print(f"error: {message}", file=sys.stderr, flush=True)
    logger.error(message)
    os._exit(EXIT_CLUSTER_FAILED)


class Deadline:
    """Exits the process with one line when a block overruns: a collective stuck on a dead peer never returns."""

    def __init__(self, seconds: float, message: Callable[[], str]):
        self._timer = threading.Timer(seconds, lambda: fatal(message()))
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
