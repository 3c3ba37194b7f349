"""MCP: Gradio's own MCP server (`launch(mcp_server=True)`, `gradio[mcp]`) serves the page's public API endpoints as
tools, with their descriptions (web/page/handlers.API_DOC: every argument); its calls go through Gradio's queue like any
API call. Two things of Gradio's are set right here, and with --api-key or --auth MCP clients need a bearer key:

- Names. Gradio names a tool after its Python function (`answer`, `refuse`), not its endpoint; `name_tools` gives
  every tool its endpoint's api_name (`generate`, `generate_png`, `history`), so an agent and gradio_client see one
  name for one thing.
- Answers. Gradio answers a tool of several outputs with the Python text of its outputs, Gradio's file records
  included: the server's temporary paths (`/tmp/.../gradio/<hash>/image.jpg`, also inside each `/gradio_api/file=`
  URL). `mcp_content` answers instead with each image as MCP image content (base64, its bytes as written: the PNG's
  `parameters` chunk kept), its caption, then the other outputs as text; no path, no file URL.
"""

from __future__ import annotations

import base64
import json
import logging
import pathlib
from typing import Any

from ..gradio_internals import answer_mcp_with, is_file_record, public_endpoints
from .auth import ApiAccess
from .queue_call import Refused

logger = logging.getLogger("sdxl_jax.app")

#: Where Gradio serves MCP (streamable HTTP and SSE).
MCP_PATH = "/gradio_api/mcp"
#: The image files a tool answers with, by suffix: their MIME types.
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp"}


def name_tools(blocks) -> list[str]:
    """Give each public endpoint's function its api_name as its `__name__` (Gradio names the MCP tool after it);
    the tools' names. Done before launch: Gradio reads the names when its MCP server starts."""
    named = []
    for api_name, function in public_endpoints(blocks):
        function.__name__ = api_name
        named.append(api_name)
    return named


def mcp_content(data: Any, root_url: str = "") -> list:
    """A tool's outputs as MCP content: each image (a Gradio file record, or a gallery item of one) as base64 image
    content then its caption, every other output as text (JSON unless it is text). Takes Gradio's two shapes: the
    outputs' list, or a list holding the client's tuple of them. No path or file URL is said."""
    from mcp import types  # optional: gradio's [mcp] extra, for --mcp only

    content: list = []

    def add(value: Any) -> None:
        if is_file_record(value):
            content.append(image_content(value["path"], types))
        elif isinstance(value, dict) and is_file_record(value.get("image")):  # a gallery item
            content.append(image_content(value["image"]["path"], types))
            if value.get("caption"):
                content.append(types.TextContent(type="text", text=str(value["caption"])))
        elif isinstance(value, (list, tuple)) and any(holds_file(item) for item in value):
            for item in value:
                add(item)
        elif value is not None:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
            content.append(types.TextContent(type="text", text=text))

    for output in data:  # gradio_client answers a tool of several outputs with their tuple
        for value in output if isinstance(output, tuple) else (output,):
            add(value)
    return content


def holds_file(value: Any) -> bool:
    """Whether `value` is, or holds, a Gradio file record."""
    if is_file_record(value):
        return True
    if isinstance(value, dict):
        return is_file_record(value.get("image"))
    if isinstance(value, (list, tuple)):
        return any(holds_file(item) for item in value)
    return False


def image_content(path: str, types) -> Any:
    """One image file of an answer as MCP image content (its own bytes); a sentence when it cannot be read."""
    file = pathlib.Path(path)
    kind = IMAGE_TYPES.get(file.suffix.lower())
    try:
        if kind is None:
            raise OSError("not an image file")
        data = file.read_bytes()
    except OSError:
        logger.warning("an MCP answer's image could not be read")
        return types.TextContent(type="text", text="(an image that could not be read)")
    return types.ImageContent(type="image", data=base64.b64encode(data).decode("ascii"), mimeType=kind)


class McpGate:
    """ASGI middleware in front of MCP_PATH: the answers as `mcp_content` makes them (set on Gradio's MCP server
    before it answers its first request), and with keys or logins `Authorization: Bearer KEY` (one of --api-key)."""

    def __init__(self, app, access: ApiAccess) -> None:
        self.app = app
        self.access = access
        self.answers_set = False

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope.get("path", "").startswith(MCP_PATH):
            return await self.app(scope, receive, send)
        if not self.answers_set:
            self.answers_set = answer_mcp_with(scope, mcp_content)  # GradioMCPServer's step from outputs to content
        if self.access.keys or self.access.logins:
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization", b"").decode("latin-1")
            try:
                self.access.bearer_caller(authorization, "")
            except Refused as exc:
                body = json.dumps({"detail": exc.message}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return None
        return await self.app(scope, receive, send)
