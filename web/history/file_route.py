"""The History's image files, served to their owner only: `GET <root>/history-file/<entry>/<index>[/thumbnail]`.

Gradio's own file route serves any file in its cache to anyone signed in who knows the URL; a past generation must
reach no one but the user who made it. So these files never enter Gradio's cache: this ASGI middleware answers
their URLs itself, after finding the signed-in user from Gradio's login cookie (web/gradio_internals.signed_in_user),
and a file that is not the caller's (another user's, an unknown entry, no login) is a plain 404, the same for all, so
a URL tells a stranger nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.responses import FileResponse, PlainTextResponse, Response

from ..gradio_internals import signed_in_user

#: The route, below the app's root path: entry id, image index, and "/thumbnail" for the small JPEG.
ROUTE = "history-file"
_PATH = re.compile(rf"/{ROUTE}/(\d{{1,18}})/(\d{{1,3}})(/thumbnail)?/?$")


def file_url(root: str, entry_id: int, index: int, thumbnail: bool = False) -> str:
    """The URL of one history file under the app's public `root` (no trailing slash)."""
    return f"{root}/{ROUTE}/{int(entry_id)}/{int(index)}" + ("/thumbnail" if thumbnail else "")


class HistoryFiles:
    """ASGI middleware answering the history file route; `find(user, entry_id, index, thumbnail)` -> the file's
    path, its bytes (an object store), or None."""

    def __init__(self, app, find: Callable[[str, int, int, bool], Path | bytes | None]) -> None:
        self.app = app
        self.find = find

    async def __call__(self, scope, receive, send) -> None:
        match = _PATH.search(scope.get("path", "")) if scope.get("type") == "http" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        user = signed_in_user(scope)
        path = None
        if user is not None and scope.get("method") in ("GET", "HEAD"):
            path = await run_in_threadpool(self.find, user, int(match[1]), int(match[2]), bool(match[3]))
        private = {"Cache-Control": "private, max-age=86400"}  # a shared cache must never hand it to another user
        if path is None:
            response = PlainTextResponse("Not found", status_code=404)
        elif isinstance(path, bytes):
            response = Response(path, media_type=_content_type(path), headers=private)
        else:
            response = FileResponse(path, headers=private)
        await response(scope, receive, send)


def _content_type(data: bytes) -> str:
    """The type of an image an entry holds, from its first bytes (an object store's file has no path to tell it)."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def owner_files_middleware(find: Callable[[str, int, int, bool], Path | bytes | None]) -> Middleware:
    """The middleware for `launch(app_kwargs={"middleware": [...]})`."""
    return Middleware(HistoryFiles, find=find)
