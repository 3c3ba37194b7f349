"""Routing a /generate call that asks for no previews to its plain-function twin, so its images are fetched once.

gradio_client downloads every file of every message a call streams, one by one (a new HTTP client per file: ~27 ms
each on 2 cores, whatever the file's size), and Gradio sends a generator's last message twice: streamed, then as the
answer. So a generator's answer of 8 JPEGs costs its caller 16 downloads, where a plain function's costs 8. /generate
must stream (the pictures forming), but a call with `previews=False` streams nothing before its answer: this ASGI
middleware reads Gradio's POST .../queue/join and sends such a call to the same handler registered as a plain
function (`Handlers.endpoint(streams=False)`, a private twin event with the same inputs, outputs and concurrency
group); its cancel (which names the event the client called) is sent to the twin as well; everything else
passes unchanged.
"""

from __future__ import annotations

import collections
import json
import threading
from dataclasses import dataclass

from starlette.middleware import Middleware

from ..gradio_internals import JOIN, body_event_id, call_data, called_event, joined_event_id, naming_event, queue_post
from .asgi_json_body import read_json_body


@dataclass(frozen=True)
class Twin:
    """A streaming event and its plain twin: Gradio's function indexes, and where `previews` is in a call's data."""

    streaming: int  # fn_index of the generator (the public /generate)
    whole: int  # fn_index of its plain twin
    previews_at: int  # index of the `previews` argument in the call's `data`


class TwinRouting:
    """The twins the page registered (`add`), the calls sent to them, and the middleware that sends them."""

    def __init__(self, remember: int = 1024) -> None:
        self._twins: dict[int, Twin] = {}
        self._sent: collections.OrderedDict[str, Twin] = collections.OrderedDict()  # event id -> its twin
        self._remember = remember
        self._lock = threading.Lock()

    def add(self, twin: Twin) -> None:
        self._twins[twin.streaming] = twin

    def route(self, call: dict) -> Twin | None:
        """The twin a queue/join body goes to (a call to a streaming event with `previews` False), or None."""
        twin = self._twins.get(called_event(call))
        data = call_data(call)
        if twin is None or data is None or len(data) <= twin.previews_at:
            return None
        return twin if data[twin.previews_at] is False else None

    def sent(self, event_id: str, twin: Twin) -> None:
        """Gradio gave a routed call this event id (the join's answer): its cancel must name the twin too."""
        with self._lock:
            self._sent[event_id] = twin
            while len(self._sent) > self._remember:
                self._sent.popitem(last=False)

    def cancel_route(self, cancel: dict) -> Twin | None:
        """The twin a /cancel body must name instead (the client names the event it called), or None."""
        with self._lock:
            twin = self._sent.get(str(body_event_id(cancel)))
        return twin if twin is not None and called_event(cancel) == twin.streaming else None

    def middleware(self) -> Middleware:
        """The ASGI middleware (for `launch(app_kwargs={"middleware": [...]})`)."""
        return Middleware(_TwinRouter, answers=self)


class _TwinRouter:
    """ASGI middleware: reads the bodies of Gradio's POST .../queue/join and .../cancel and passes them on, naming
    the twin when `TwinRouting` says so (a cancel names the event that runs it, else Gradio cannot stop it)."""

    def __init__(self, app, answers: TwinRouting) -> None:
        self.app = app
        self.answers = answers

    async def __call__(self, scope, receive, send):
        post = queue_post(scope)
        if post is None:
            return await self.app(scope, receive, send)
        messages, call = await read_json_body(receive)
        call = call if isinstance(call, dict) else None
        joining = post == JOIN
        twin = None if call is None else self.answers.route(call) if joining else self.answers.cancel_route(call)
        if twin is not None:
            body = json.dumps(naming_event(call, twin.whole)).encode()
            messages = [{"type": "http.request", "body": body, "more_body": False}]
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
            scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        pending = iter(messages)

        async def replay():
            return next(pending, None) or await receive()

        if twin is None or not joining:
            return await self.app(scope, replay, send)
        answer = b""

        async def note_event(message):  # the join's answer: {"event_id": ...}, or a refusal (a full queue: 503)
            nonlocal answer
            if message.get("type") == "http.response.body":
                answer += message.get("body", b"")
                event_id = None if message.get("more_body") else joined_event_id(answer)
                if event_id is not None:
                    self.answers.sent(event_id, twin)
            await send(message)

        return await self.app(scope, replay, note_event)
