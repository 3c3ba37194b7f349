"""Leaving the app's process once it has closed everything it owns, without the interpreter's teardown.

After SIGTERM an idle app closed its server, PNG writers, history and files in 0.3 s, and its exit handlers (JAX's
own `clean_up` among them: backends cleared, `jax.distributed` shut down) ran in under 2 s; then Python's
finalization, taking every module, the weights' arrays and JAX's runtime apart object by object, took 22 s more
(load average 20; measured with timestamps around each step). Nothing of the app needs that teardown: its files
are gone and its stores closed by then. So `leave` runs the exit handlers, flushes the standard streams and ends the
process with `os._exit`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys


def leave(code: int) -> None:
    """End the process with status `code`: exit handlers (logging's flush, JAX's clean-up), the standard streams
    flushed, then `os._exit` (no interpreter finalization). Call it last, from the main thread."""
    atexit._run_exitfuncs()  # what a normal exit runs first; CPython's own entry point for it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe: the status still goes out
            stream.flush()
    os._exit(code)
