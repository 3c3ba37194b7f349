"""Multi-process output: drop the lines gloo (the CPU collectives) prints from C++ to stdout, which nothing reads."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable

#: What gloo (the CPU collectives) prints to stdout, from C++, for each new communicator; nothing reads it.
_GLOO_LINE = b"[Gloo] Rank "
#: Undoes drop_gloo_lines (set while it is active); faults.fatal calls `restore` so its last line is not lost.
_restore_output: Callable[[], None] | None = None


def drop_gloo_lines() -> None:
    """Pass this process's output through a thread that drops gloo's "[Gloo] Rank 0 is connected to 1 peer ranks"
    lines (printed by C++ to stdout, with no setting to turn them off); undone at exit, after the last line is out.

    When stdout and stderr go to the same place (a terminal, `2>&1`), both go through the one pipe, so their lines
    keep their order; otherwise only stdout does.
    """
    global _restore_output
    if _restore_output is not None or os.environ.get("SDXL_KEEP_GLOO_LINES"):
        return
    fds = (1, 2) if os.path.samestat(os.fstat(1), os.fstat(2)) else (1,)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    originals = {fd: os.dup(fd) for fd in fds}
    read_end, write_end = os.pipe()
    for fd in fds:
        os.dup2(write_end, fd)
    os.close(write_end)
    target = originals[1]

    def pump() -> None:
        with os.fdopen(read_end, "rb") as source:
            for line in source:
                while line and not line.startswith(_GLOO_LINE):
                    line = line[os.write(target, line) :]

    thread = threading.Thread(target=pump, name="output-without-gloo", daemon=True)
    thread.start()

    def restore() -> None:
        global _restore_output
        if _restore_output is None:
            return
        _restore_output = None
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, original in originals.items():
            os.dup2(original, fd)  # the pipe's last write end goes: the pump reads to the end and stops
        thread.join(timeout=5)

    _restore_output = restore
    atexit.register(restore)


def restore() -> None:
    """Undo `drop_gloo_lines` (no-op when it is not active), letting what is still in the pipe out first."""
    if _restore_output is not None:
        _restore_output()
