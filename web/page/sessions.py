"""Per-session state of the page: each browser tab's Stop flag, the gallery it was last shown, its early cancel.

A browser tab (or an API client) is a Gradio session (`gr.Request.session_hash`): its Stop flag, the gallery files it
was last shown and a cancel it sent too early live here, keyed by it. `EarlyCancels` reads Gradio's cancel calls
(their shape: web/gradio_internals.py).
"""

from __future__ import annotations

import collections
import pathlib
import threading
import time
from collections.abc import Sequence

from starlette.middleware import Middleware

from pipeline.contract.stopping import StopFlag

from ..gradio_internals import CANCEL, body_event_id, body_session, queue_post
from ..serving.asgi_json_body import read_json_body


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


class ShownImages:
    """The gallery files each browser session was last shown, so the page's PNG follow-up needs no file input (and a
    stopped request's previews can give way to them again)."""

    def __init__(self, keep: int = 256) -> None:
        self._names: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        self._galleries: dict[str, list[tuple[str, str]]] = {}  # (file, caption) per image, as last answered
        self._selected: dict[str, str | None] = {}  # the file each session clicked last (Vary starts from it)
        self._keep = keep
        self._lock = threading.Lock()

    def remember(self, session: str, paths: Sequence[pathlib.Path], gallery: Sequence[tuple[str, str]] = ()) -> None:
        with self._lock:
            self._names[session] = [pathlib.Path(p).name for p in paths]
            self._galleries[session] = list(gallery)
            self._names.move_to_end(session)
            self._selected.pop(session, None)  # a new answer: nothing of it is selected yet
            while len(self._names) > self._keep:
                forgotten = self._names.popitem(last=False)[0]
                self._selected.pop(forgotten, None)
                self._galleries.pop(forgotten, None)

    def gallery(self, session: str) -> list[tuple[str, str]]:
        """The (file, caption) pairs this session was last answered, those whose files are still on disk."""
        with self._lock:
            shown = list(self._galleries.get(session, []))
        return [(path, caption) for path, caption in shown if pathlib.Path(path).is_file()]

    def names(self, session: str) -> list[str]:
        with self._lock:
            return list(self._names.get(session, []))

    def select(self, session: str, name: str | None) -> None:
        """The gallery file this session clicked (one of those it was shown), or None."""
        with self._lock:
            shown = self._names.get(session, [])
            self._selected[session] = name if name in shown else None

    def selected(self, session: str) -> str | None:
        with self._lock:
            return self._selected.get(session)


def session_of(request) -> str:
    """The calling browser tab's (or API client's) session id; "" for a direct call."""
    return getattr(request, "session_hash", None) or ""


class EarlyCancels:
    """`job.cancel()` sent before the client knew its job's id (gradio_client, right after `submit()`).

    Gradio cancels by event id; such a cancel names none, so Gradio can neither drop the job from its queue nor stop
    it, and the request ran all its steps. This remembers, per session, a cancel that named no event (an ASGI
    middleware reads Gradio's /cancel calls), and the session's next request takes it: it stops before its first
    step. A note not taken within `ttl_s` is forgotten.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self._noted: dict[str, float] = {}
        self._ttl_s = ttl_s
        self._lock = threading.Lock()

    def note(self, session: str) -> None:
        with self._lock:
            self._noted[session] = time.monotonic()

    def take(self, session: str) -> bool:
        """True (once) when this session sent a cancel that named no job, within the last `ttl_s` seconds."""
        with self._lock:
            noted = self._noted.pop(session, None)
        return noted is not None and time.monotonic() - noted < self._ttl_s

    def middleware(self) -> Middleware:
        """The ASGI middleware that feeds this (for `launch(app_kwargs={"middleware": [...]})`)."""
        return Middleware(_CancelWatcher, cancels=self)


class _CancelWatcher:
    """ASGI middleware: reads the body of Gradio's POST .../cancel, notes a cancel without an event id, and passes
    the request on unchanged."""

    def __init__(self, app, cancels: EarlyCancels) -> None:
        self.app = app
        self.cancels = cancels

    async def __call__(self, scope, receive, send):
        if queue_post(scope) != CANCEL:
            return await self.app(scope, receive, send)
        messages, data = await read_json_body(receive)
        if isinstance(data, dict) and body_session(data) and not body_event_id(data):
            self.cancels.note(str(body_session(data)))
        pending = iter(messages)

        async def replay():
            return next(pending, None) or await receive()

        return await self.app(scope, replay, send)
