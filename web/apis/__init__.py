"""The APIs other tools speak, on the app's own port: AUTOMATIC1111's `/sdapi/v1`, OpenAI Images `/v1`, and MCP.

    apis = attach_apis(page, ApiAccess(...))   # before launch: the page's queue gets the APIs' events
    page.launch(port=7860, **apis)              # routes=[...], middleware=[...], mcp_server=...

Every generation goes through the page's own queue and handler (queue_call.py); auth.py says who may call, and
guard.py wraps every A1111 and OpenAI route (the caller first; each refusal one sentence in that API's shape). APIs left
off (a reachable host without logins or --api) answer every request with one sentence naming the flag, in their own
error shape, and the start-up log says so.
"""

from __future__ import annotations

import logging

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..page.layout import Page
from .a1111 import A1111Api, a1111_error
from .auth import APIS_OFF, ApiAccess
from .guard import REFUSED
from .images import RequestFiles, ServedFiles
from .mcp import MCP_PATH, McpGate, name_tools
from .openai_images import OpenAIImages, openai_error
from .queue_call import QueuedGenerate

__all__ = ["ApiAccess", "attach_apis"]

logger = logging.getLogger("sdxl_jax.app")
#: The status of a switched-off API's answer: refused by how the server was started, not missing.
OFF_STATUS = 403
#: Every method a switched-off route answers.
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def attach_apis(page: Page, access: ApiAccess) -> dict:
    """Register the APIs on `page` (before it launches) and log what is off or open; the keywords `Page.launch`
    takes for them."""
    for level, line in access.startup_notes():
        logger.log(level, line)
    settings: dict = {"mcp_server": access.mcp}
    if access.mcp:
        tools = name_tools(page.demo)
        settings["middleware"] = [Middleware(McpGate, access=access)]
        logger.info("MCP: %s/ with the tools %s", MCP_PATH, ", ".join(tools))
    if not access.enabled:
        return {**settings, "routes": switched_off_routes()}
    queued = QueuedGenerate.register(page)
    files = RequestFiles(page.files.root)
    served = ServedFiles(page.files.root)
    routes = [
        *A1111Api(queued, access, files).router().routes,
        *OpenAIImages(queued, access, files, served).router().routes,
    ]
    return {**settings, "routes": routes}


def switched_off_routes() -> list[Route]:
    """The APIs' paths when they are off: one sentence naming the flag, as A1111's `{"detail"}` and OpenAI's
    `{"error": {"message"}}`, rather than Gradio's bare 404."""

    async def a1111(request: Request) -> JSONResponse:
        return a1111_error(OFF_STATUS, APIS_OFF, REFUSED)

    async def openai(request: Request) -> JSONResponse:
        return openai_error(OFF_STATUS, APIS_OFF, REFUSED)

    return [
        Route("/sdapi/v1/{rest:path}", a1111, methods=METHODS),
        Route("/v1/images/{rest:path}", openai, methods=METHODS),
        Route("/v1/models", openai, methods=METHODS),
    ]
