"""The OpenAI Images API (`/v1/images/generations`, `/v1/images/edits`, `/v1/models`) on the app's own port.

    from openai import OpenAI
    client = OpenAI(base_url="http://localhost:7860/v1", api_key="KEY")   # any key without --api-key/--auth
    client.images.generate(prompt="a lighthouse", size="1024x1024", response_format="b64_json")

`size` must be one of the compiled sizes (a 400 lists them); `n` images come from as many queued calls as needed,
seeds consecutive; `response_format` "b64_json" (the default here) or "url": a copy under a random 192-bit name,
served for an hour. `model` is accepted and the served model is reported. Fields of this server's table (seed,
steps, ...) are taken too; every other field is ignored.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import PLAIN, echo
from pipeline.contract.parameters import model_name

from .auth import ApiAccess
from .guard import guarded, json_object
from .images import RequestFiles, ServedFiles, check_picture, png_base64
from .queue_call import QueuedGenerate, Refused

#: OpenAI's limit on `n`.
MAX_N = 10
FORMATS = ("b64_json", "url")


class OpenAIImages:
    """The routes and what they share."""

    def __init__(self, queued: QueuedGenerate, access: ApiAccess, files: RequestFiles, served: ServedFiles) -> None:
        self.queued = queued
        self.access = access
        self.files = files
        self.served = served
        self.engine = queued.page.handlers.engine
        self.rules = queued.page.handlers.rules
        self.model = model_name(self.engine.config.model)

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/v1")
        for path, handler, method in (
            ("/images/generations", self.generations, "POST"),
            ("/images/edits", self.edits, "POST"),
            ("/models", self.models, "GET"),
        ):
            route = guarded(handler, self.access.bearer_caller, openai_error)  # a bearer key with --api-key/--auth
            router.add_api_route(path, route, methods=[method], include_in_schema=False)
        router.add_api_route("/images/files/{name}", self.file, methods=["GET"], include_in_schema=False)
        return router

    async def generations(self, request: Request, caller: str):
        return await self._generate(request, caller, json_object(await request.body()), {})

    async def edits(self, request: Request, caller: str):
        """Multipart: `image` (or `image[]`, the first is used), optional `mask` (transparent = edit), the rest as in
        generations."""
        try:
            form = await request.form(max_files=4, max_fields=64)
        except Exception:  # a body that is not a multipart form  # noqa: BLE001
            raise InvalidInput("The request must be multipart/form-data with an image file.") from None
        try:
            upload = form.get("image") or form.get("image[]")
            if upload is None or not hasattr(upload, "read"):
                raise InvalidInput("The image file is missing (multipart field 'image').")
            pictures = {"init_image": check_picture(await upload.read(), "image"), "mask_image": None}
            mask = form.get("mask")
            if mask is not None and hasattr(mask, "read"):
                pictures["mask_image"] = repaint_mask(check_picture(await mask.read(), "mask"))
            payload = {key: value for key, value in form.items() if isinstance(value, str)}
        finally:
            await form.close()
        return await self._generate(request, caller, payload, pictures)

    async def _generate(self, request: Request, caller: str, payload: dict, pictures: dict) -> JSONResponse:
        given, count, response_format = self._fields(payload, picture=bool(pictures))
        per_call = self.engine.num_images
        pngs: list[str] = []
        first_seed = None
        with self.files.hold(pictures) as held:
            given.update(held)
            for call in range(-(-count // per_call)):
                if first_seed is not None:
                    given.update(seed=(first_seed + call * per_call) % 2**32, randomize_seed=False)
                outcome = await self.queued.run(request, given, caller=caller, image_format="png")
                if outcome.stopped:
                    raise Refused(503, outcome.status)
                first_seed = outcome.seed if first_seed is None else first_seed
                pngs += outcome.pngs
        pngs = pngs[:count]
        if response_format == "url":
            base = str(request.base_url).rstrip("/")
            data = [{"url": f"{base}/v1/images/files/{self.served.publish(path)}"} for path in pngs]
        else:
            data = [{"b64_json": text} for text in await asyncio.to_thread(lambda: [png_base64(p) for p in pngs])]
        height, width = (
            self.rules.sizes[0]
            if not given.get("aspect_ratio")
            else tuple(int(part) for part in reversed(given["aspect_ratio"].split("x")))
        )
        return JSONResponse(
            {
                "created": int(time.time()),
                "data": data,
                "model": self.model,
                "output_format": "png",
                "size": f"{width}x{height}",
                "seed": first_seed,
            }
        )

    def _fields(self, payload: dict, picture: bool) -> tuple[dict, int, str]:
        """The handler's fields, the image count and the answer's format from an OpenAI payload."""
        given: dict[str, Any] = {"prompt": payload.get("prompt", ""), "randomize_seed": True}
        n = payload.get("n", 1)
        n = int(n) if isinstance(n, str) and n.strip().isdigit() else n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise InvalidInput(f"n must be a whole number from 1 to {MAX_N}; got {echo(n)}.")
        response_format = payload.get("response_format") or "b64_json"
        if response_format not in FORMATS:
            raise InvalidInput(f"response_format must be one of: {', '.join(FORMATS)}; got {echo(response_format)}.")
        size = payload.get("size")
        offered = [f"{w}x{h}" for h, w in self.rules.sizes]
        if size not in (None, "", "auto"):
            if size not in offered:
                raise InvalidInput(
                    f"Size {echo(size)} is not offered by this server; choose one of: {', '.join(offered)}."
                )
            given["aspect_ratio"] = size
        for row in PLAIN:  # this server's own fields (steps, guidance_scale, strength, ...): an extension
            if row.name in payload and (picture or row.name != "strength"):
                given[row.name] = number(payload[row.name])
        if payload.get("seed") not in (None, "", -1, "-1"):
            given.update(seed=number(payload["seed"]), randomize_seed=False)
        if payload.get("negative_prompt"):
            given["negative_prompt"] = payload["negative_prompt"]
        return given, n, response_format

    async def models(self, request: Request, caller: str):
        return JSONResponse(
            {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "sdxl-jax"}]}
        )

    async def file(self, name: str):
        """A `url` answer's file: unguessable name, expires (404 after)."""
        path = self.served.path(name)
        if path is None:
            return error(404, "No such image (its link may have expired).", "invalid_request_error")
        return FileResponse(path, media_type="image/png")


def error(status: int, message: str, kind: str) -> JSONResponse:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)


def openai_error(status: int, message: str, kind: str) -> JSONResponse:
    """A refusal as OpenAI answers one: a missing key 401, a refusal by how the server was started 403, the server's
    own trouble (a full queue, a server stopping) 5xx, and every refusal of the request's input 400 (422 elsewhere)."""
    if status == 401:
        return error(401, message, "authentication_error")
    if status == 403:
        return error(403, message, "permission_error")
    if status >= 500:
        return error(status, message, "server_error")
    return error(400, message, "invalid_request_error")


def number(value: object) -> object:
    """A form field's text as a number where it is one (multipart sends every field as text)."""
    if isinstance(value, str):
        try:
            as_float = float(value)
        except ValueError:
            return value
        return int(as_float) if as_float.is_integer() and "." not in value else as_float
    return value


def repaint_mask(data: bytes) -> bytes:
    """OpenAI's mask (fully transparent = edit) as this engine's (white = repaint)."""
    with Image.open(io.BytesIO(data)) as image:
        if "A" not in image.getbands():
            raise InvalidInput("The mask must have an alpha channel: transparent where the image should change.")
        alpha = np.asarray(image.convert("RGBA"))[..., 3]  # [H, W]
    buffer = io.BytesIO()
    Image.fromarray(((alpha == 0) * 255).astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
