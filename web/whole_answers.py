"""A /generate call that asks for no previews is answered by a plain function: its images are fetched once.

gradio_client downloads every file of every message a call streams, one by one (a new HTTP client per file: ~27 ms
each on 2 cores, whatever the file's size), and Gradio sends a generator's last message twice: streamed, then as the
answer. So a generator's answer of 8 JPEGs costs its caller 16 downloads, where a plain function's costs 8. /generate
must stream (the pictures forming), but a call with `previews=False` streams nothing before its answer: this ASGI
middleware reads Gradio's POST .../queue/join and sends such a call to the same handler registered as a plain
function (`Handlers.endpoint(streams=False)`, a private twin event with the same inputs, outputs and concurrency
group); everything else passes unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.middleware import Middleware


@dataclass(frozen=True)
class Twin:
    """A streaming event and its plain twin: Gradio's function indexes, and where `previews` is in a call's data."""

    streaming: int  # fn_index of the generator (the public /generate)
    whole: int  # fn_index of its plain twin
    previews_at: int  # index of the `previews` argument in the call's `data`


class WholeAnswers:
    """The twins the page registered (`add`), and the middleware that routes calls without previews to them."""

    def __init__(self) -> None:
        self._twins: dict[int, Twin] = {}

    def add(self, twin: Twin) -> None:
        self._twins[twin.streaming] = twin

    def route(self, call: dict) -> dict | None:
        """The call body to send on instead of `call` (a queue/join body), or None to send it unchanged."""
        twin = self._twins.get(call.get("fn_index")) if isinstance(call.get("fn_index"), int) else None
        data = call.get("data")
        if twin is None or not isinstance(data, list) or len(data) <= twin.previews_at:
            return None
        if data[twin.previews_at] is not False:
            return None
        return {**call, "fn_index": twin.whole}

    def middleware(self) -> Middleware:
        """The ASGI middleware (for `launch(app_kwargs={"middleware": [...]})`)."""
        return Middleware(_JoinRouter, answers=self)


class _JoinRouter:
    """ASGI middleware: reads the body of Gradio's POST .../queue/join and passes it on, to the twin when
    `WholeAnswers.route` says so."""

    def __init__(self, app, answers: WholeAnswers) -> None:
        self.app = app
        self.answers = answers

    async def __call__(self, scope, receive, send):
        joining = scope.get("method") == "POST" and scope.get("path", "").endswith("/queue/join")
        if scope["type"] != "http" or not joining:
            return await self.app(scope, receive, send)
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if message.get("type") != "http.request" or not message.get("more_body"):
                break
        try:
            call = json.loads(body or b"{}")
        except ValueError:
            call = None
        routed = self.answers.route(call) if isinstance(call, dict) else None
        if routed is not None:
            body = json.dumps(routed).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        pending = iter(messages)

        async def replay():
            return next(pending, None) or await receive()

        return await self.app(scope, replay, send)
