"""Reading a request's JSON body inside ASGI middleware, so the request can still be passed on whole.

The page's middlewares (web/page/sessions.py's early cancels, web/serving/twin_routing.py's calls without previews)
look at Gradio's small POST bodies before Gradio does: they must keep every body message to replay to the app.
"""

from __future__ import annotations

import json


async def read_json_body(receive) -> tuple[list, object]:
    """A request's body messages (to replay) and its JSON value (None when it is not JSON)."""
    messages, body = [], b""
    while True:
        message = await receive()
        messages.append(message)
        body += message.get("body", b"")
        if message.get("type") != "http.request" or not message.get("more_body"):
            break
    try:
        return messages, json.loads(body or b"{}")
    except ValueError:
        return messages, None
