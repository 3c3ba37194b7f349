"""Every use of Gradio's internals, in one place: what the page needs of Gradio that its public API does not give.

Gradio's public API builds the page, runs its events and serves it; a few things the app does go below it: telling a
cancelled request between two steps, pushing the HTTP APIs' requests into the page's own queue, routing a call to
another event, finding the signed-in user and the public URL, naming MCP's tools and shaping their answers. Each
function here names the internal it reads or sets, and `RELIED_ON` lists them all: tests/web/test_gradio_internals.py
checks each against the installed Gradio (names, signatures, fields), so a release that changes one fails there,
naming it, before a page does. No other module of web/ imports Gradio's private modules or reads a Blocks' private
attributes (the same test reads them for it).

Imported inside functions: gradio, gradio_client, fastapi and starlette (heavy: Gradio, 4 s; `web.serving.temp_files`
imports this module before Gradio may be imported, and Gradio reads GRADIO_TEMP_DIR at its import).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

#: The internals this module relies on, each checked by tests/web/test_gradio_internals.py (one test per name).
RELIED_ON = (
    "Dependency['id']",  # gr.on / .click return the event's fn_index under "id"
    "Blocks.fns",  # {fn_index: BlockFunction} with .api_name, .api_visibility, .fn
    "Blocks._queue",  # gradio.queueing.Queue, replaced by Blocks.queue()
    "Queue.push",  # push(body=PredictBodyInternal, request=, username=) -> (ok, detail, state)
    "Queue.clean_events",  # clean_events(session_hash=)
    "Queue.server_app",  # None until launch; set_server_app(Blocks.app)
    "Queue.active_jobs",  # [None | [Event]], each Event with ._id and .alive
    "Queue.pending_event_ids_session",  # {session: {event id}}
    "Queue.pending_messages_per_session",  # {session: asyncio queue of gradio.server_messages}
    "Blocks.state_holder.session_data",  # {session: SessionState}
    "gradio.context.LocalContext",  # .blocks and .event_id: ContextVars set while an event runs
    "gradio.data_classes.PredictBodyInternal",  # session_hash, data, fn_index, request
    "gradio.server_messages",  # ProgressMessage, ProcessGeneratingMessage, ProcessCompletedMessage, UnexpectedError...
    "queue protocol",  # POST {API_PREFIX}/queue/join and /cancel bodies: fn_index, data, session_hash, event_id
    "gradio.route_utils.API_PREFIX",
    "gradio.route_utils.DEFAULT_TEMP_DIR",
    "gradio.route_utils.get_api_call_path",
    "gradio.route_utils.get_root_url",
    "gr.Request.request",  # the underlying Starlette request
    "App.tokens / App.cookie_id",  # the login cookie access-token[-unsecure]-{cookie_id} -> username
    "App.get_blocks().mcp_server_obj.postprocess_output_data",
    "gradio_client.utils.is_file_obj_with_meta",
)


# --- Events: their indexes, the public endpoints ------------------------------------------------------------------


def event_index(dependency) -> int:
    """The index Gradio gives an event (its `fn_index`, what a queue/join call names), from what `gr.on`, `.click`
    and the other listeners return (a `gradio.events.Dependency`, a dict)."""
    return dependency["id"]


def public_endpoints(blocks) -> list[tuple[str, Callable]]:
    """(api_name, function) of every public API endpoint of `blocks` (`Blocks.fns`: a BlockFunction per event)."""
    return [
        (block_fn.api_name, block_fn.fn)
        for block_fn in blocks.fns.values()
        if block_fn.api_visibility == "public" and block_fn.api_name and block_fn.fn is not None
    ]


# --- The queue's HTTP protocol: what the page's ASGI middlewares read of a call ----------------------------------

#: The two POSTs of Gradio's queue protocol the page's middlewares read, by how their paths end (below API_PREFIX).
JOIN, CANCEL = "/queue/join", "/cancel"


def queue_post(scope) -> str | None:
    """JOIN or CANCEL when an ASGI request is that POST of Gradio's queue protocol (gradio_client and the page's JS
    send them), else None."""
    if scope["type"] != "http" or scope.get("method") != "POST":
        return None
    path = scope.get("path", "")
    return JOIN if path.endswith(JOIN) else CANCEL if path.endswith(CANCEL) else None


def called_event(body: dict) -> int | None:
    """The event a queue/join or cancel body names (its `fn_index`), or None."""
    event = body.get("fn_index")
    return event if isinstance(event, int) else None


def naming_event(body: dict, event: int) -> dict:
    """The same call, naming another event."""
    return {**body, "fn_index": event}


def call_data(body: dict) -> list | None:
    """A queue/join body's inputs (`data`, in the event's input order), or None."""
    data = body.get("data")
    return data if isinstance(data, list) else None


def body_event_id(body: dict) -> Any:
    """The event id a cancel body names (`event_id`; gradio_client sends none right after `submit()`)."""
    return body.get("event_id")


def body_session(body: dict) -> Any:
    """The session a queue protocol body comes from (`session_hash`)."""
    return body.get("session_hash")


def joined_event_id(answer: bytes) -> str | None:
    """The event id Gradio's answer to a queue/join gives the call (`{"event_id": ...}`); None for a refusal."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        return str(json.loads(answer)["event_id"])
    return None


# --- The queue in-process: a running event's fate, the APIs' pushes -----------------------------------------------


def request_gone() -> bool:
    """True once Gradio no longer runs the calling request: cancelled (`job.cancel()`, another event's `cancels`)
    or its page closed (the queue marks its job not alive). Read from Gradio's queue, between two steps
    (`LocalContext`: the running event's Blocks and id; `Queue.active_jobs`' events, `_id` and `alive`)."""
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


def answers_delivered(blocks) -> bool:
    """True when Gradio's queue runs no event and every session's stream has been handed the answers it waits for
    (`Queue.active_jobs`, `Queue.pending_event_ids_session`: the events each session still waits for)."""
    queue = getattr(blocks, "_queue", None)
    if queue is None:
        return True
    return not any(queue.active_jobs) and not any(queue.pending_event_ids_session.values())


def as_queue_join(request):
    """An HTTP request as Gradio's queue reads a joining one (its URL tells the queue where it was called: only
    .../queue/join and .../call/... are known), headers and client kept."""
    from fastapi import Request
    from gradio.route_utils import API_PREFIX

    root = request.scope.get("root_path", "")
    path = f"{root}{API_PREFIX}{JOIN}"
    return Request({**request.scope, "path": path, "raw_path": path.encode()})


#: What a message of an event's stream says, as the APIs read it.
MessageKind = Literal["progress", "generating", "completed", "failed", "other"]


@dataclass(frozen=True)
class QueueMessage:
    """One message of a queued event's stream (one of `gradio.server_messages`' classes), in the APIs' terms."""

    kind: MessageKind  # progress: a step; generating: a streamed output; completed: the answer; failed: Gradio's error
    success: bool = False  # generating, completed: whether the handler's output is an answer (not its gr.Error)
    output: dict = field(default_factory=dict)  # generating, completed: {"data": [...]} or {"error": ...}
    title: str | None = None  # completed without success: the gr.Error's title
    step: int = 0  # progress: the first progress unit's index and length
    total: int = 0


def queue_message(message) -> QueueMessage:
    """A message of `Queue.pending_messages_per_session` as a QueueMessage."""
    from gradio.server_messages import (
        ProcessCompletedMessage,
        ProcessGeneratingMessage,
        ProgressMessage,
        UnexpectedErrorMessage,
    )

    if isinstance(message, ProgressMessage) and message.progress_data:
        unit = message.progress_data[0]
        return QueueMessage("progress", step=int(unit.index or 0), total=int(unit.length or 0))
    if isinstance(message, ProcessGeneratingMessage):
        return QueueMessage("generating", success=message.success, output=message.output)
    if isinstance(message, ProcessCompletedMessage):
        return QueueMessage("completed", success=message.success, output=message.output, title=message.title)
    if isinstance(message, UnexpectedErrorMessage):
        return QueueMessage("failed")
    return QueueMessage("other")


class EventQueue:
    """The page's Gradio queue (`Blocks._queue`) as the HTTP APIs use it: push an event of a session of their own,
    read that session's stream, cancel it, forget it. Its requests get the page's concurrency groups, limits and
    `--queue-size`, as Gradio's own `/gradio_api/call/{api_name}` route pushes them."""

    def __init__(self, blocks) -> None:
        self.blocks = blocks

    @property
    def _queue(self):
        return self.blocks._queue  # read at each use: Blocks.queue() replaces it

    async def push(self, *, session: str, event: int, data: list, request, username: str | None) -> tuple:
        """Queue one call of `event` (its fn_index) for `session`: Gradio's (ok, detail, state), state "queue_full"
        when the queue is."""
        from gradio.data_classes import PredictBodyInternal

        queue = self._queue
        if queue.server_app is None:
            queue.set_server_app(self.blocks.app)
        request = as_queue_join(request)
        body = PredictBodyInternal(session_hash=session, data=data, fn_index=event, request=request)
        return await queue.push(body=body, request=request, username=username)

    def messages(self, session: str) -> Callable[[], Awaitable[QueueMessage]]:
        """The session's stream (after `push`): each call of the function returned awaits its next message."""
        stream = self._queue.pending_messages_per_session[session]

        async def next_message() -> QueueMessage:
            return queue_message(await stream.get())

        return next_message

    async def cancel(self, session: str) -> None:
        """End the session's events (the client went away)."""
        await self._queue.clean_events(session_hash=session)

    def forget(self, session: str) -> None:
        """Drop what the queue and the Blocks keep of a finished session (its stream, its event ids, its state)."""
        queue = self._queue
        queue.pending_messages_per_session.pop(session, None)
        queue.pending_event_ids_session.pop(session, None)
        self.blocks.state_holder.session_data.pop(session, None)


# --- Files, URLs, logins -------------------------------------------------------------------------------------------


def import_time_temp_dir() -> str:
    """The temporary directory Gradio read when it was imported (`route_utils.DEFAULT_TEMP_DIR`): where it keeps what
    it makes before GRADIO_TEMP_DIR is looked up again."""
    from gradio.route_utils import DEFAULT_TEMP_DIR

    return DEFAULT_TEMP_DIR


def public_root(request) -> str:
    """The app's public URL as the caller of this event reached it (behind a proxy, the proxy's), without a trailing
    slash; "" for a direct call (`gr.Request.request`, `route_utils.get_api_call_path` and `get_root_url`)."""
    from gradio import route_utils

    http = getattr(request, "request", None)
    if http is None:
        return ""
    try:
        route = route_utils.get_api_call_path(request=http)
    except ValueError:
        route = http.url.path
    app = http.scope.get("app")
    return route_utils.get_root_url(request=http, route_path=route, root_path=getattr(app, "root_path", None))


def signed_in_user(scope) -> str | None:
    """The user Gradio's login cookie names in an ASGI request, or None (no login, or an app without Gradio's logins):
    `App.tokens` (token -> username) and the cookie `access-token-{App.cookie_id}` (`-unsecure-` over plain HTTP)."""
    from starlette.requests import Request

    app = scope.get("app")
    tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
    if tokens is None or cookie_id is None:
        return None
    cookies = Request(scope).cookies
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return tokens.get(token) if token else None


# --- MCP -----------------------------------------------------------------------------------------------------------


def is_file_record(value: Any) -> bool:
    """Whether `value` is a Gradio file record (a FileData dict: `path` and `meta` `{"_type": "gradio.FileData"}`)."""
    from gradio_client.utils import is_file_obj_with_meta

    return is_file_obj_with_meta(value)


def answer_mcp_with(scope, postprocess: Callable[[Any, str], list]) -> bool:
    """Have the Gradio MCP server of the app serving this ASGI request make its tools' answers with `postprocess`
    (outputs, root URL -> MCP content), in place of its own step (`GradioMCPServer.postprocess_output_data`, reached
    as `App.get_blocks().mcp_server_obj`). False when that server is not there (yet)."""
    blocks = getattr(scope.get("app"), "get_blocks", lambda: None)()
    server = getattr(blocks, "mcp_server_obj", None)
    if server is None:
        return False
    server.postprocess_output_data = postprocess
    return True
