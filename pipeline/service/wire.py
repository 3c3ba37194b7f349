"""What travels between the page and an engine over HTTP, both ways, as newline-delimited JSON.

The body of `POST /v1/generate` is `Request.to_dict()` (pipeline/contract/request.py). The answer is one JSON object a
line, each with an `event`:

    {"event": "step", "done": 3, "total": 8}                        after each denoising step
    {"event": "preview", "done": 2, "total": 8, "images": [PNG…]}   the pictures forming (latent size), every 2 steps
    {"event": "result", "images": [PNG…], "parameters": [...], "seeds": [...], ...}   the finished images
    {"event": "stopped", "done": 3, "total": 8}                     stopped between steps (the server shutting down)
    {"event": "error", "message": "one sentence"}                   failed after the answer had started

Images are PNG bytes in base64, each with its A1111 `parameters` text (in the PNG and beside it). Kept free of JAX.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, PngImagePlugin

from ..contract.controlnet_units import sent_maps, with_modules
from ..contract.errors import InvalidInput
from ..contract.fields import PLAIN
from ..contract.request import LORA_TAG, Request, RequestRules, parse_request
from ..contract.styles import DEFAULT_STYLE

#: The NDJSON media type of a streamed answer.
STREAM_TYPE = "application/x-ndjson"
#: zlib level of the PNGs on the wire: lossless, fast (level 1 costs a third of the default's time at 1024²).
PNG_LEVEL = 1
#: Threads encoding or decoding one answer's PNGs at once (zlib releases the GIL: 8 images at 1024² take a quarter
#: of the serial time on 4 cores).
PNG_THREADS = max(1, min(8, os.cpu_count() or 1))


def _each(function, items: list) -> list:
    """`function` over `items`, in parallel threads when there are several."""
    if len(items) < 2 or PNG_THREADS < 2:
        return [function(*item) for item in items]
    with ThreadPoolExecutor(min(PNG_THREADS, len(items))) as pool:
        return list(pool.map(lambda item: function(*item), items))


def line(event: str, **fields) -> bytes:
    """One event of the stream, newline-terminated."""
    return json.dumps({"event": event, **fields}, separators=(",", ":")).encode() + b"\n"


def png_b64(image: Image.Image, parameters: str | None = None) -> str:
    """A PIL image as base64 PNG, its `parameters` text chunk kept."""
    buffer = io.BytesIO()
    info = None
    if parameters:
        info = PngImagePlugin.PngInfo()
        info.add_text("parameters", parameters)
    image.save(buffer, format="PNG", pnginfo=info, compress_level=PNG_LEVEL)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_of(text: str, parameters: str | None = None) -> Image.Image:
    """A base64 PNG back as a loaded PIL image, `.info["parameters"]` set."""
    image = Image.open(io.BytesIO(base64.b64decode(text)))
    image.load()
    if parameters is not None:
        image.info["parameters"] = parameters
    return image


def previews_line(done: int, total: int, pixels: np.ndarray) -> bytes:
    """A preview event: uint8 [B, h, w, 3] at latent size as PNGs."""
    images = [png_b64(Image.fromarray(np.ascontiguousarray(picture))) for picture in pixels]
    return line("preview", done=done, total=total, images=images)


def preview_pixels(event: dict) -> np.ndarray:
    """A preview event's pictures back as uint8 [B, h, w, 3]."""
    return np.stack([np.asarray(image_of(text).convert("RGB")) for text in event["images"]])


def result_line(result) -> bytes:
    """The finished request: a GenerationResult's images (PNG + parameters) and what the page shows of it."""
    images = _each(png_b64, list(zip(result.images, result.parameters, strict=True)))
    return line(
        "result",
        images=images,
        parameters=list(result.parameters),
        seeds=list(result.seeds),
        prompt=result.prompt,
        negative_prompt=result.negative_prompt,
        truncated=result.truncated,
        timings=dict(result.timings),
        steps=result.steps,
        sampler=result.sampler,
    )


@dataclass(frozen=True)
class RemoteResult:
    """A result event as the page reads it: the same attributes as the engine's GenerationResult."""

    images: list  # PIL images, each with .info["parameters"]
    seeds: list[int]
    prompt: str
    negative_prompt: str
    truncated: str
    parameters: list[str]
    timings: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    sampler: str = ""

    @classmethod
    def of(cls, event: dict) -> RemoteResult:
        parameters = list(event["parameters"])
        images = _each(image_of, list(zip(event["images"], parameters, strict=True)))
        return cls(
            images=images,
            seeds=list(event["seeds"]),
            prompt=event["prompt"],
            negative_prompt=event["negative_prompt"],
            truncated=event["truncated"],
            parameters=parameters,
            timings=dict(event.get("timings") or {}),
            steps=int(event["steps"]),
            sampler=event["sampler"],
        )


#: The fields a page computes from the others with its own style templates: taken as sent when they are given.
STYLED = ("styled_prompt", "written_prompt", "styled_negative_prompt")


def request_from_wire(data: object, rules: RequestRules) -> Request:
    """A `Request.to_dict()` body checked against this engine's rules, as `parse_request` checks the page's input
    (bounds, sizes, LoRAs, pictures): one `InvalidInput` sentence otherwise. A hand-written body may give just
    {"prompt": ...}; the styled texts a page computed are kept as sent."""
    if not isinstance(data, Mapping):
        raise InvalidInput("The body must be a JSON object: a request in the wire format of Request.to_dict().")
    known = {item.name for item in dataclasses.fields(Request) if item.compare}
    if unknown := sorted(set(data) - known):
        raise InvalidInput(f"Unknown request field {unknown[0]!r}; GET /v1/info's request_schema lists the fields.")
    pictures = {name: _picture(data.get(name), name) for name in ("init_image", "mask_image")}
    tagged = {match.group(1).strip().lower() for match in LORA_TAG.finditer(str(data.get("prompt") or ""))}
    loras = data.get("loras")
    if isinstance(loras, list):  # the prompt's own tags are read from the prompt again: not twice
        loras = [item for item in loras if not (isinstance(item, list) and item and str(item[0]).lower() in tagged)]
    controls, modules = sent_maps(data.get("controlnets"))  # maps made where the request entered: not made again
    checked = parse_request(
        data.get("prompt"),
        data.get("negative_prompt", ""),
        data.get("style", DEFAULT_STYLE),
        seed=data.get("seed", 0),
        size=data.get("size"),
        loras=loras,
        **pictures,
        controlnets=controls,
        rules=rules,
        **{row.name: data.get(row.name) for row in PLAIN},
    )
    styled = {name: data[name] for name in STYLED if isinstance(data.get(name), str) and data[name]}
    ignored = data.get("ignored")
    ignored = (
        tuple(ignored) if isinstance(ignored, list) and all(isinstance(x, str) for x in ignored) else checked.ignored
    )
    return dataclasses.replace(
        checked, **styled, ignored=ignored, controlnets=with_modules(checked.controlnets, modules)
    )


def _picture(value: object, name: str) -> bytes | None:
    if value is None:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{name} must be a base64-encoded PNG.") from None
