"""The /generate-without-previews router (web/serving/twin_routing.py) in front of a plain ASGI app: a routed join's
answer passes through whole, whether Gradio gave it an event id or refused it (a full queue: 503 with no event id)."""

import asyncio
import json

from web.serving.twin_routing import Twin, TwinRouting


def joined(status: int, answer: dict) -> tuple[list[dict], dict, TwinRouting]:
    """POST .../queue/join of a call without previews through the router; the ASGI messages sent, the body the
    app behind it received, and the router's record."""
    answers = TwinRouting()
    answers.add(Twin(streaming=3, whole=7, previews_at=1))
    seen = {}

    async def app(scope, receive, send):  # Gradio's join as ASGI: read the body, answer JSON
        seen.update(json.loads((await receive())["body"]))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode(), "more_body": False})

    router = answers.middleware().cls(app, answers=answers)
    body = json.dumps({"fn_index": 3, "data": ["a kite", False], "session_hash": "s"}).encode()
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": []}
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(router(scope, receive, send))
    return sent, seen, answers


def test_a_call_without_previews_joins_the_twin_and_its_cancel_is_routed():
    sent, seen, answers = joined(200, {"event_id": "e1"})
    assert seen["fn_index"] == 7 and json.loads(sent[-1]["body"]) == {"event_id": "e1"}
    assert answers.cancel_route({"event_id": "e1", "fn_index": 3}).whole == 7


def test_a_full_queue_refusal_reaches_the_caller_whole():
    """Gradio answers a join to a full queue with 503 and no event id: the caller gets that answer (gradio_client
    raises "Queue is full"), not a connection closed mid-body."""
    sent, _, answers = joined(503, {"detail": "Queue is full"})
    assert sent[0]["status"] == 503 and json.loads(sent[-1]["body"]) == {"detail": "Queue is full"}
    assert answers.cancel_route({"event_id": "None", "fn_index": 3}) is None
