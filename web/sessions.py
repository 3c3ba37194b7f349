"""Per-session state of the page, and the one place that reads Gradio's internals.

A browser tab is a Gradio session (`gr.Request.session_hash`): its Stop flag and the gallery files it was last shown
live here, keyed by it. `request_gone` reads Gradio's queue to tell a cancelled or closed request between two steps.
"""

from __future__ import annotations

import collections
import pathlib
import threading
from collections.abc import Sequence

from pipeline.host.loop import StopFlag


class StopRequests:
    """The page's Stop button: one flag per browser session, set by Stop, read by that session's running request."""

    def __init__(self) -> None:
        self._flags: dict[str, StopFlag] = {}
        self._lock = threading.Lock()

    def begin(self, session: str) -> StopFlag:
        with self._lock:
            flag = self._flags[session] = StopFlag()
            return flag

    def end(self, session: str, flag: StopFlag) -> None:
        with self._lock:
            if self._flags.get(session) is flag:
                del self._flags[session]

    def stop(self, session: str) -> bool:
        """Stop this session's request, if one runs; True if there was one."""
        with self._lock:
            flag = self._flags.get(session)
        if flag is not None:
            flag.set()
        return flag is not None


def request_gone() -> bool:
    """True once Gradio no longer runs the calling request: cancelled (`job.cancel()`, another event's `cancels`)
    or its page closed (the queue marks its job not alive). Read from Gradio's queue, between two steps."""
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return False  # not run by the queue (a direct call): nothing can cancel it
    for job in list(queue.active_jobs):
        for event in job or ():
            if event._id == event_id:
                return not event.alive
    return True  # no longer among the running jobs: its task was cancelled


class ShownImages:
    """The gallery files each browser session was last shown, so the page's PNG follow-up needs no file input."""

    def __init__(self, keep: int = 256) -> None:
        self._names: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()

    def remember(self, session: str, paths: Sequence[pathlib.Path]) -> None:
        with self._lock:
            self._names[session] = [pathlib.Path(p).name for p in paths]
            self._names.move_to_end(session)
            while len(self._names) > self._keep:
                self._names.popitem(last=False)

    def names(self, session: str) -> list[str]:
        with self._lock:
            return list(self._names.get(session, []))


def session_of(request) -> str:
    """The calling browser tab's (or API client's) session id; "" for a direct call."""
    return getattr(request, "session_hash", None) or ""
