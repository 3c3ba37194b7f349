"""Gradio's internals the page relies on (web/gradio_internals.py), checked against the installed Gradio.

One test per internal `RELIED_ON` names, each using it as the page does, on a small Blocks with its FastAPI app and
its queue in this process (no engine, no server; a few seconds): a Gradio release that moves or reshapes one fails
here with one sentence naming it, rather than in a running page. And no other module of web/ touches them.
"""

from __future__ import annotations

import ast
import asyncio
import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO

from web import gradio_internals as internals
from web.gradio_internals import RELIED_ON, EventQueue

#: The checks, by the name RELIED_ON gives their internal.
CHECKS: dict[str, Callable[[Toy], None]] = {}


def checks(internal: str):
    def register(check):
        CHECKS[internal] = check
        return check

    return register


@dataclass
class Toy:
    """A Blocks of two events on one textbox (the public "echo" and a private one), queued, not launched."""

    blocks: object
    echo: int  # the public event's index
    echo_fn: Callable
    dependency: object  # what `.submit` returned for it
    private: int  # the private event's index (a twin, as web/serving/twin_routing.py sends calls to)


@pytest.fixture(scope="module")
def toy() -> Toy:
    import gradio as gr

    def echo(text: str) -> str:
        return text

    with gr.Blocks() as blocks:
        box, out = gr.Textbox(), gr.Textbox()
        dependency = box.submit(echo, box, out, api_name="echo")
        private = box.change(echo, box, out, api_name="echo_privately", api_visibility="private")
    blocks.queue(max_size=8)
    return Toy(blocks, dependency["id"], echo, dependency, private["id"])


def http_request(toy: Toy, path: str = "/sdapi/v1/txt2img", cookie: str = ""):
    """A Starlette request as an HTTP API route gets one from the toy's app."""
    from starlette.requests import Request

    headers = [(b"host", b"h:7860"), *([(b"cookie", cookie.encode())] if cookie else [])]
    return Request(
        {
            "type": "http",
            "method": "POST",
            "path": path,
            "root_path": "",
            "headers": headers,
            "query_string": b"",
            "client": ("127.0.0.1", 1),
            "server": ("h", 7860),
            "scheme": "http",
            "app": toy.blocks.app,
        }
    )


def pushed(toy: Toy, session: str) -> str:
    """Push one call of "echo" for `session` as the HTTP APIs do; its event id."""
    queue = EventQueue(toy.blocks)
    ok, event_id, state = asyncio.run(
        queue.push(session=session, event=toy.echo, data=["a kite"], request=http_request(toy), username=None)
    )
    assert ok and state == "success", (ok, event_id, state)
    return event_id


@checks("Dependency['id']")
def _(toy: Toy) -> None:
    assert isinstance(internals.event_index(toy.dependency), int)
    assert toy.blocks.fns[internals.event_index(toy.dependency)].api_name == "echo"


@checks("Blocks.fns")
def _(toy: Toy) -> None:
    assert internals.public_endpoints(toy.blocks) == [("echo", toy.echo_fn)]


@checks("Blocks._queue")
def _(toy: Toy) -> None:
    from gradio.queueing import Queue

    assert isinstance(toy.blocks._queue, Queue)


@checks("Queue.push")
def _(toy: Toy) -> None:
    event_id = pushed(toy, "push")
    assert event_id in toy.blocks._queue.pending_event_ids_session["push"]
    EventQueue(toy.blocks).forget("push")


@checks("Queue.clean_events")
def _(toy: Toy) -> None:
    pushed(toy, "cancelled")
    asyncio.run(EventQueue(toy.blocks).cancel("cancelled"))
    assert not toy.blocks._queue.pending_event_ids_session.get("cancelled")  # dropped from the queue
    EventQueue(toy.blocks).forget("cancelled")


@checks("Queue.server_app")
def _(toy: Toy) -> None:
    queue = toy.blocks._queue
    assert "server_app" in vars(queue)
    assert list(inspect.signature(queue.set_server_app).parameters) == ["app"]
    pushed(toy, "server app")
    assert queue.server_app is toy.blocks.app  # set by the first push, as Gradio's own join route does
    EventQueue(toy.blocks).forget("server app")


@checks("Queue.active_jobs")
def _(toy: Toy) -> None:
    from gradio.context import LocalContext
    from gradio.queueing import Event

    queue = toy.blocks._queue
    assert isinstance(queue.active_jobs, list)
    event = Event("running", toy.blocks.fns[toy.echo], http_request(toy), None)
    saved = queue.active_jobs
    try:
        queue.active_jobs = [None, [event]]
        assert not internals.answers_delivered(toy.blocks)

        def in_the_event() -> tuple[bool, bool, bool]:
            LocalContext.blocks.set(toy.blocks)
            LocalContext.event_id.set(event._id)
            running = internals.request_gone()
            event.alive = False
            closed = internals.request_gone()
            queue.active_jobs = [None]
            return running, closed, internals.request_gone()

        assert contextvars.copy_context().run(in_the_event) == (False, True, True)
    finally:
        queue.active_jobs = saved


@checks("Queue.pending_event_ids_session")
def _(toy: Toy) -> None:
    assert internals.answers_delivered(toy.blocks)
    pushed(toy, "waiting")
    assert not internals.answers_delivered(toy.blocks)  # the session still waits for its answer
    EventQueue(toy.blocks).forget("waiting")
    assert internals.answers_delivered(toy.blocks)


@checks("Queue.pending_messages_per_session")
def _(toy: Toy) -> None:
    from gradio.server_messages import ProcessCompletedMessage

    pushed(toy, "streamed")
    queue = EventQueue(toy.blocks)
    next_message = queue.messages("streamed")
    toy.blocks._queue.pending_messages_per_session["streamed"].put_nowait(
        ProcessCompletedMessage(output={"data": ["a kite"]}, success=True)
    )

    async def answer():
        while (message := await asyncio.wait_for(next_message(), 5)).kind == "other":  # the queue's estimations
            pass
        return message

    message = asyncio.run(answer())
    assert (message.kind, message.success, message.output) == ("completed", True, {"data": ["a kite"]})
    queue.forget("streamed")
    assert "streamed" not in toy.blocks._queue.pending_messages_per_session


@checks("Blocks.state_holder.session_data")
def _(toy: Toy) -> None:
    toy.blocks.state_holder.session_data["kept"] = object()
    EventQueue(toy.blocks).forget("kept")
    assert "kept" not in toy.blocks.state_holder.session_data


@checks("gradio.context.LocalContext")
def _(toy: Toy) -> None:
    from gradio.context import LocalContext

    assert isinstance(LocalContext.blocks, contextvars.ContextVar)
    assert isinstance(LocalContext.event_id, contextvars.ContextVar)
    assert contextvars.Context().run(internals.request_gone) is False  # not run by the queue: nothing cancels it


@checks("gradio.data_classes.PredictBodyInternal")
def _(toy: Toy) -> None:
    from gradio.data_classes import PredictBodyInternal

    body = PredictBodyInternal(session_hash="s", data=["a kite"], fn_index=toy.echo, request=http_request(toy))
    assert (body.session_hash, body.data, body.fn_index) == ("s", ["a kite"], toy.echo)


@checks("gradio.server_messages")
def _(toy: Toy) -> None:
    from gradio import server_messages as messages

    progress = messages.ProgressMessage(progress_data=[messages.ProgressUnit(index=2, length=8)])
    assert internals.queue_message(progress) == internals.QueueMessage("progress", step=2, total=8)
    streamed = messages.ProcessGeneratingMessage(output={"data": [[["a.jpg", None]]]}, success=True)
    gallery = {"data": [[["a.jpg", None]]]}
    assert internals.queue_message(streamed) == internals.QueueMessage("generating", True, gallery)
    refused = messages.ProcessCompletedMessage(output={"error": "No."}, success=False, title="Invalid input")
    assert internals.queue_message(refused) == internals.QueueMessage(
        "completed", False, {"error": "No."}, "Invalid input"
    )
    assert internals.queue_message(messages.UnexpectedErrorMessage(message="boom")).kind == "failed"


@checks("queue protocol")
def _(toy: Toy) -> None:
    from gradio.route_utils import API_PREFIX
    from starlette.testclient import TestClient

    client = TestClient(toy.blocks.app)  # no lifespan: the queue is not started, a joined call waits in it
    join = {"fn_index": toy.echo, "data": ["a kite"], "session_hash": "protocol"}
    assert internals.queue_post({"type": "http", "method": "POST", "path": f"{API_PREFIX}/queue/join"}) == "/queue/join"
    assert (internals.called_event(join), internals.call_data(join), internals.body_session(join)) == (
        toy.echo,
        ["a kite"],
        "protocol",
    )
    joined = client.post(f"{API_PREFIX}{internals.JOIN}", json=join)
    event_id = internals.joined_event_id(joined.content)
    assert joined.status_code == 200 and event_id, joined.text
    to_twin = client.post(f"{API_PREFIX}{internals.JOIN}", json=internals.naming_event(join, toy.private))
    assert to_twin.status_code == 200 and internals.joined_event_id(to_twin.content), to_twin.text
    assert internals.joined_event_id(b'{"detail": "Queue is full."}') is None  # a refusal names no event
    cancel = {"session_hash": "protocol", "fn_index": toy.echo, "event_id": event_id}
    assert internals.queue_post({"type": "http", "method": "POST", "path": f"{API_PREFIX}/cancel"}) == internals.CANCEL
    assert internals.body_event_id(cancel) == event_id
    cancelled = client.post(f"{API_PREFIX}{internals.CANCEL}", json=cancel)
    assert cancelled.status_code == 200, cancelled.text
    EventQueue(toy.blocks).forget("protocol")


@checks("gradio.route_utils.API_PREFIX")
def _(toy: Toy) -> None:
    from gradio.route_utils import API_PREFIX

    request = internals.as_queue_join(http_request(toy))
    assert request.url.path == f"{API_PREFIX}/queue/join" and request.headers["host"] == "h:7860"


@checks("gradio.route_utils.DEFAULT_TEMP_DIR")
def _(toy: Toy) -> None:
    assert isinstance(internals.import_time_temp_dir(), str) and internals.import_time_temp_dir()


@checks("gradio.route_utils.get_api_call_path")
def _(toy: Toy) -> None:
    from gradio import route_utils

    joining = http_request(toy, "/gradio_api/queue/join")
    assert route_utils.get_api_call_path(request=joining) == "/gradio_api/queue/join"
    with pytest.raises(ValueError):  # public_root's fallback: a path that is not one of Gradio's API calls
        route_utils.get_api_call_path(request=http_request(toy, "/sdapi/v1/txt2img"))


@checks("gradio.route_utils.get_root_url")
def _(toy: Toy) -> None:
    import gradio as gr

    assert internals.public_root(gr.Request(request=http_request(toy, "/gradio_api/queue/join"))) == "http://h:7860"
    assert internals.public_root(None) == ""


@checks("gr.Request.request")
def _(toy: Toy) -> None:
    import gradio as gr

    http = http_request(toy)
    assert gr.Request(request=http).request is http


@checks("App.tokens / App.cookie_id")
def _(toy: Toy) -> None:
    from starlette.testclient import TestClient

    app = toy.blocks.app
    app.auth = {"alice": "secret"}
    try:
        login = TestClient(app).post("/login", data={"username": "alice", "password": "secret"})
    finally:
        app.auth = None
    assert login.status_code == 200, login.text
    for name, token in login.cookies.items():  # the secure cookie and the plain-HTTP one
        assert internals.signed_in_user(http_request(toy, cookie=f"{name}={token}").scope) == "alice", name
    assert len(login.cookies) == 2
    assert internals.signed_in_user(http_request(toy).scope) is None


@checks("App.get_blocks().mcp_server_obj.postprocess_output_data")
def _(toy: Toy) -> None:
    from gradio.mcp import GradioMCPServer

    assert list(inspect.signature(GradioMCPServer.postprocess_output_data).parameters)[1:] == ["data", "root_url"]
    assert "self.postprocess_output_data(" in inspect.getsource(GradioMCPServer)  # the step its tool calls take
    assert toy.blocks.app.get_blocks() is toy.blocks

    def answer(data, root_url=""):
        return []

    toy.blocks.mcp_server_obj = server = GradioMCPServer(toy.blocks)
    try:
        assert internals.answer_mcp_with({"app": toy.blocks.app}, answer)
        assert server.postprocess_output_data is answer
    finally:
        toy.blocks.mcp_server_obj = None
    assert not internals.answer_mcp_with({"app": toy.blocks.app}, answer)


@checks("gradio_client.utils.is_file_obj_with_meta")
def _(toy: Toy) -> None:
    assert internals.is_file_record({"path": "/tmp/a.png", "meta": {"_type": "gradio.FileData"}})
    assert not internals.is_file_record({"path": "/tmp/a.png"})
    assert not internals.is_file_record("/tmp/a.png")


def test_each_internal_relied_on_is_checked():
    assert set(CHECKS) == set(RELIED_ON), "checks and RELIED_ON differ: " + ", ".join(
        sorted(set(CHECKS) ^ set(RELIED_ON))
    )


@pytest.mark.parametrize("internal", RELIED_ON)
def test_gradio_still_has(internal: str, toy: Toy):
    import gradio

    try:
        CHECKS[internal](toy)
    except Exception as exc:  # any failure means the internal moved or changed shape
        pytest.fail(
            f"Gradio {gradio.__version__} changed `{internal}`, which web/gradio_internals.py relies on: "
            f"{type(exc).__name__}: {exc}",
            pytrace=False,
        )


#: What only web/gradio_internals.py may name: Gradio's private modules, and the attributes and protocol keys it reads.
PRIVATE_MODULES = ("gradio.", "gradio_client")
PRIVATE_NAMES = {
    "_queue",
    "fns",
    "state_holder",
    "server_app",
    "set_server_app",
    "active_jobs",
    "pending_event_ids_session",
    "pending_messages_per_session",
    "clean_events",
    "mcp_server_obj",
    "postprocess_output_data",
    "cookie_id",
    "tokens",
    "get_blocks",
    "fn_index",
    "LocalContext",
    "PredictBodyInternal",
    "route_utils",
}


def test_no_other_module_of_web_touches_gradio_internals():
    """Every other module imports only `gradio` itself and names none of what gradio_internals.py reads."""
    found = []
    for path in sorted((REPO / "web").rglob("*.py")):
        if path.name == "gradio_internals.py":
            continue
        where = Path(path).relative_to(REPO)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [f"{where}:{node.lineno} imports {name}" for name in modules if name.startswith(PRIVATE_MODULES)]
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_NAMES:
                found.append(f"{where}:{node.lineno} reads .{node.attr}")
            if isinstance(node, ast.Constant) and node.value in PRIVATE_NAMES:
                found.append(f"{where}:{node.lineno} names {node.value!r}")
    assert not found, "Gradio's internals outside web/gradio_internals.py: " + "; ".join(found)
