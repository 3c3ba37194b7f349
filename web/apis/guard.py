"""The one wrapper around every route of the two HTTP APIs (a1111.py, openai_images.py): who calls (auth.py) is
settled first, then the route runs; a refusal (a login missing, a full queue, a request the handler refused) or a bad
input ends as one sentence in that API's own error shape (`Answer`), never a traceback.

    route = guarded(handler, access.bearer_caller, openai_error)   # handler(request, caller) -> response
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from pipeline.contract.errors import InvalidInput

from .queue_call import Refused

#: (the Authorization header, the client's host) -> the caller's identity, or Refused(401): auth.ApiAccess's.
Identify = Callable[[str | None, str], str]
#: (HTTP status, one sentence, REFUSED or INVALID) -> the API's own error answer.
Answer = Callable[[int, str, str], Response]
#: A route's body: (the request, the caller's identity) -> its answer.
Handler = Callable[[Request, str], Awaitable[Response]]

#: Why an answer is an error: turned away (auth, the queue, the handler's refusal), or input a check refused here.
REFUSED, INVALID = "Refused", "InvalidInput"
#: The status of input a route refused itself (the handler's own refusals keep theirs: queue_call.refusal).
INVALID_STATUS = 422


def guarded(handler: Handler, identify: Identify, answer: Answer) -> Callable[[Request], Awaitable[Response]]:
    """`handler` as a route: the caller identified, every refusal answered as `answer` shapes it."""

    async def route(request: Request):  # no return annotation: FastAPI would read it as a response model
        try:
            caller = identify(request.headers.get("authorization"), client_host(request))
            return await handler(request, caller)
        except Refused as exc:
            return answer(exc.status, exc.message, REFUSED)
        except InvalidInput as exc:
            return answer(INVALID_STATUS, str(exc), INVALID)

    return route


def client_host(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def json_object(body: bytes) -> dict:
    """A JSON body that must be an object (both APIs' generation bodies): broken JSON and JSON of another shape are
    two mistakes, each said as itself, since a caller fixing a quoting error should not hunt for a wrong shape."""
    if not body.strip():
        raise InvalidInput("The request body is empty; send a JSON object.")
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise InvalidInput(f"The request body is not valid JSON{where}.") from None
    if not isinstance(payload, dict):
        raise InvalidInput(f"The request body must be a JSON object ({{...}}); got a JSON {_json_kind(payload)}.")
    return payload


def _json_kind(value: object) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
