"""Stopping a request between steps: the flag a Stop button sets and the exception a stopped request ends with.

Apart from the loop (host/loop.py, which checks them before each step) so that the page (web/) can use them without
importing JAX.
"""

from __future__ import annotations

import threading


class Stopped(Exception):
    """The request was stopped between steps (Stop, a cancelled job, a closed tab); nothing is wrong."""

    def __init__(self, done: int, total: int):
        super().__init__(f"stopped at step {done} / {total}")
        self.done = done  # steps dispatched before the stop
        self.total = total  # steps the request asked for


class StopFlag:
    """A thread-safe Stop button: `set()` from any thread, passed as `should_stop` (it is callable)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()
