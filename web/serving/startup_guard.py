"""Ctrl-C during start-up: one line, exit status 130, within a moment, at any point, nothing left behind.

Raising KeyboardInterrupt into whatever runs when SIGINT arrives cannot promise that: inside a gc callback or a
`__del__` Python swallows it ("Exception ignored ...") and start-up goes on to serve; while the main thread waits in
a long C call (an XLA compile) the handler only runs when the call returns, minutes later; and at exit Python waits
for JAX's threads (40 s and more). So `StartupGuard` runs the slow part of start-up in a worker thread, keeps the
main thread waiting in short slices (where Python runs a signal handler at once), and its handler prints the line,
removes what start-up wrote and leaves with `os._exit`. Nothing here imports Gradio or JAX: the guard is in place
before either is imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports it
T = TypeVar("T")


class StartupGuard:
    """Within `with StartupGuard("app.py") as guard:` Ctrl-C (or SIGTERM) ends the process at once, cleanly."""

    def __init__(self, prog: str, cleanup: Callable[[], None] | None = None) -> None:
        self.prog = prog  # names the program in its one line
        self.cleanup = cleanup  # removes what start-up wrote (the app's temporary folder)
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StartupGuard:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._stop)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def run(self, work: Callable[[], T]) -> T:
        """`work()` in a worker thread while the main thread stays free for the signal; its result or exception."""
        outcome: dict[str, object] = {}

        def target() -> None:
            try:
                outcome["result"] = work()
            except BaseException as exc:  # handed to the main thread, as if `work` had run there
                outcome["error"] = exc

        worker = threading.Thread(target=target, name="start-up", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(timeout=0.1)
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["result"]  # type: ignore[return-value]

    def _stop(self, signum, _frame) -> None:
        # The start-up thread may be logging right now: its line ends first, and no other starts after (the
        # handlers' locks are kept until the exit), so the last line is ours, whole.
        logging.disable(logging.CRITICAL)
        for handler in logging.getLogger().handlers:
            handler.acquire()
        line = f"{self.prog}: stopped during start-up\n"
        try:  # one write: nothing can come between the words and their newline
            sys.stderr.flush()
            os.write(sys.stderr.fileno(), line.encode())
        except (OSError, ValueError):  # stderr without a file descriptor
            sys.stderr.write(line)
            sys.stderr.flush()
        if self.cleanup is not None:
            with contextlib.suppress(Exception):  # leaving matters more than a tidy folder
                self.cleanup()
        os._exit(EXIT_INTERRUPTED if signum == signal.SIGINT else 128 + signum)
