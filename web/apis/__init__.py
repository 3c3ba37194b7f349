"""The APIs other tools speak, on the app's own port: AUTOMATIC1111's `/sdapi/v1`, OpenAI Images `/v1`, and MCP.

    apis = attach_apis(page, ApiAccess(...))   # before launch: the page's queue gets the APIs' events
    page.launch(port=7860, **apis)              # routes=[...], middleware=[...], mcp_server=...

Every generation goes through the page's own queue and handler (queue_call.py); auth.py says who may call.
"""

from __future__ import annotations

from starlette.middleware import Middleware

from ..page import Page
from .a1111 import A1111Api
from .auth import ApiAccess
from .images import RequestFiles, ServedFiles
from .mcp import McpKeys
from .openai_images import OpenAIImages
from .queue_call import QueuedGenerate

__all__ = ["ApiAccess", "attach_apis"]


def attach_apis(page: Page, access: ApiAccess) -> dict:
    """Register the APIs on `page` (before it launches); the keywords `Page.launch` takes for them."""
    settings: dict = {"mcp_server": access.mcp}
    if access.mcp and (access.keys or access.logins):
        settings["middleware"] = [Middleware(McpKeys, access=access)]
    if not access.enabled:
        return settings
    queued = QueuedGenerate.register(page)
    files = RequestFiles(page.files.root)
    served = ServedFiles(page.files.root)
    routes = [*A1111Api(queued, access, files).router().routes,
              *OpenAIImages(queued, access, files, served).router().routes]  # fmt: skip
    return {**settings, "routes": routes}
