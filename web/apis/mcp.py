"""MCP: Gradio's own MCP server (`launch(mcp_server=True)`, `gradio[mcp]`) serves the page's /generate as a tool,
with the handler's docstring (web/handlers.API_DOC: every argument) as the tool's description; its calls go through
Gradio's queue like any API call. With --api-key or --auth, this ASGI middleware asks MCP clients for a bearer key.
"""

from __future__ import annotations

import json

from .auth import ApiAccess
from .queue_call import Refused

#: Where Gradio serves MCP (streamable HTTP and SSE).
MCP_PATH = "/gradio_api/mcp"


class McpKeys:
    """ASGI middleware: requests under MCP_PATH need `Authorization: Bearer KEY` (one of --api-key)."""

    def __init__(self, app, access: ApiAccess) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope.get("path", "").startswith(MCP_PATH):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        try:
            self.access.bearer_caller(authorization, "")
        except Refused as exc:
            body = json.dumps({"detail": exc.message}).encode()
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
            await send({"type": "http.response.body", "body": body})
            return None
        return await self.app(scope, receive, send)
