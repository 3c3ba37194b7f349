"""AUTOMATIC1111's HTTP API (`/sdapi/v1/...`) on the app's own port, in A1111's shapes (`modules/api/models.py`).

    curl -s localhost:7860/sdapi/v1/txt2img -H 'Content-Type: application/json' \\
         -d '{"prompt": "a lighthouse", "steps": 20, "width": 1024, "height": 1024}'

Generations run as events of the page's queue (web/apis/queue_call.py): the same handler, checks, prompt filter,
limits and history as the page. Answers as A1111's: `images` are base64 PNGs (no data: prefix) with their
`parameters` chunk, `parameters` echoes the request, `info` is a JSON *string*. The endpoints this engine has no
counterpart for answer what A1111 answers when it has none (an empty list); see ENDPOINTS.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from PIL import Image, ImageOps

from pipeline.contract.engine import Engine
from pipeline.contract.errors import InvalidInput
from pipeline.contract.hires import LATENT_UPSCALERS, UPSCALERS
from pipeline.contract.image_files import read_parameters
from pipeline.contract.parameters import model_name, parse_infotext
from pipeline.contract.request import RequestRules
from pipeline.contract.xyz_plot import SCRIPT_NAME

from ..page.png_info import parameters_text
from .a1111_fields import NO_UPSCALER, A1111Request, a1111_request, sampler_choices, scheduler_items
from .auth import ApiAccess
from .guard import guarded
from .guard import json_object as parse_json_object
from .images import RequestFiles, decode_base64, decode_picture, png_base64
from .queue_call import QueuedGenerate

logger = logging.getLogger("sdxl_jax.app")

#: A1111 1.10's endpoints (`modules/api/api.py`, the Lora extension's two) and how this server answers each:
#: "served" (does what A1111 does), "stubbed" (answers A1111's shape for a server without that feature: an empty list,
#: an accepted no-op), "missing" (404: a feature this server does not have).
ENDPOINTS = {
    "txt2img": "served",
    "img2img": "served",
    "png-info": "served",
    "progress": "served",
    "interrupt": "served",
    "options": "served",
    "samplers": "served",
    "schedulers": "served",
    "sd-models": "served",
    "loras": "served",
    "embeddings": "served",
    "prompt-styles": "served",
    "cmd-flags": "stubbed",
    "skip": "stubbed",
    "upscalers": "served",
    "latent-upscale-modes": "served",
    "sd-vae": "stubbed",
    "sd-modules": "stubbed",
    "hypernetworks": "stubbed",
    "face-restorers": "stubbed",
    "realesrgan-models": "stubbed",
    "scripts": "stubbed",
    "script-info": "stubbed",
    "extensions": "stubbed",
    "refresh-checkpoints": "stubbed",
    "refresh-vae": "stubbed",
    "refresh-loras": "stubbed",
    "refresh-embeddings": "stubbed",
    "memory": "missing",
    "extra-single-image": "missing",
    "extra-batch-images": "missing",
    "interrogate": "missing",
    "create/embedding": "missing",
    "create/hypernetwork": "missing",
    "train/embedding": "missing",
    "train/hypernetwork": "missing",
    "unload-checkpoint": "missing",
    "reload-checkpoint": "missing",
    "server-kill": "missing",
    "server-restart": "missing",
    "server-stop": "missing",
}
#: The stubs' answers (A1111's shapes for "none of these").
STUBS: dict[str, tuple[str, Any]] = {
    "cmd-flags": ("GET", {"api": True, "nowebui": False}),
    "skip": ("POST", {}),
    "sd-vae": ("GET", []),
    "sd-modules": ("GET", []),
    "hypernetworks": ("GET", []),
    "face-restorers": ("GET", []),
    "realesrgan-models": ("GET", []),
    "scripts": ("GET", {"txt2img": [SCRIPT_NAME], "img2img": [SCRIPT_NAME]}),
    "script-info": ("GET", []),
    "extensions": ("GET", []),
    "refresh-checkpoints": ("POST", None),
    "refresh-vae": ("POST", None),
    "refresh-loras": ("POST", None),
    "refresh-embeddings": ("POST", None),
}


def offered_embeddings(engine: Engine) -> dict[str, dict]:
    """The textual inversions the engine offers, by name: the one place /sdapi/v1/embeddings reads."""
    names = engine.rules.embeddings
    return {
        str(name): {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": None, "vectors": None}
        for name in names
    }


#: The scale A1111 reports for an upscaler (its `UpscalerData` default: None, Lanczos, Nearest and ESRGAN files say 4).
A1111_UPSCALER_SCALE = 4


def upscaler_items(rules: RequestRules) -> list[dict]:
    """/sdapi/v1/upscalers: A1111's "None", then the pixel upscalers the server's hires fix offers (Lanczos, Nearest,
    then any model the engine adds, by the name a request gives as `hr_upscaler`), in A1111's `UpscalerItem` shape.
    A model's `model_path` is null: a server path never reaches a caller. Without hires scales only "None"."""
    offered = [name for name in rules.hires_upscalers if name not in LATENT_UPSCALERS] if rules.hires_scales else []
    return [
        {
            "name": name,
            "model_name": None if name in UPSCALERS or name == NO_UPSCALER else name,
            "model_path": None,
            "model_url": None,
            "scale": A1111_UPSCALER_SCALE,
        }
        for name in (NO_UPSCALER, *offered)
    ]


def latent_upscale_items(rules: RequestRules) -> list[dict]:
    """/sdapi/v1/latent-upscale-modes: the latent upscalers a request may name (A1111's `shared.latent_upscale_modes`
    that the server offers), [] without hires scales (A1111 lists them because it always has a hires fix)."""
    offered = [name for name in rules.hires_upscalers if name in LATENT_UPSCALERS] if rules.hires_scales else []
    return [{"name": name} for name in offered]


class A1111Api:
    """The routes and what they share: the queue, the request files, the access rules, the engine's facts."""

    def __init__(self, queued: QueuedGenerate, access: ApiAccess, files: RequestFiles) -> None:
        self.queued = queued
        self.access = access
        self.files = files
        page = queued.page
        self.engine = page.handlers.engine
        self.rules = page.handlers.rules
        self.model = model_name(self.engine.config.model)

    def router(self) -> APIRouter:
        router = APIRouter(prefix="/sdapi/v1")
        routes = {
            ("POST", "txt2img"): self.txt2img,
            ("POST", "img2img"): self.img2img,
            ("POST", "png-info"): self.png_info,
            ("GET", "progress"): self.progress,
            ("POST", "interrupt"): self.interrupt,
            ("GET", "options"): self.options,
            ("POST", "options"): self.set_options,
            ("GET", "samplers"): self.samplers,
            ("GET", "schedulers"): self.schedulers,
            ("GET", "sd-models"): self.sd_models,
            ("GET", "loras"): self.loras,
            ("GET", "embeddings"): self.embeddings,
            ("GET", "prompt-styles"): self.prompt_styles,
            ("GET", "upscalers"): self.upscalers,
            ("GET", "latent-upscale-modes"): self.latent_upscale_modes,
        }
        for name, (method, answer) in STUBS.items():
            routes[(method, name)] = self._stub(answer)
        for (method, name), handler in routes.items():
            route = guarded(handler, self.access.a1111_caller, a1111_error)  # HTTP Basic with --auth
            router.add_api_route(f"/{name}", route, methods=[method], include_in_schema=False)
        return router

    @staticmethod
    def _stub(answer: Any):
        async def stub(request: Request, caller: str):
            return JSONResponse(answer)

        return stub

    # ---- generation ------------------------------------------------------------------------------------------------

    async def txt2img(self, request: Request, caller: str):
        payload = await json_object(request)
        asked = a1111_request(payload, self.rules, picture=False)
        if is_plot(payload):
            return await self._plot(request, caller, payload, asked)
        return await self._generate(request, caller, payload, asked)

    async def img2img(self, request: Request, caller: str):
        payload = await json_object(request)
        asked = a1111_request(payload, self.rules, picture=True)
        images = payload.get("init_images")
        if not isinstance(images, list) or not images:
            raise InvalidInput("init_images must be a list with one base64-encoded picture.")
        pictures = {"init_image": decode_picture(images[0], "image"), "mask_image": None}  # named as on the page
        if payload.get("mask"):
            mask = decode_picture(payload["mask"], "mask")
            pictures["mask_image"] = inverted(mask) if payload.get("inpainting_mask_invert") else mask
        if is_plot(payload):
            return await self._plot(request, caller, payload, asked, pictures)
        return await self._generate(request, caller, payload, asked, pictures)

    async def _plot(
        self, request: Request, caller: str, payload: dict, asked: A1111Request, pictures: dict | None = None
    ) -> JSONResponse:
        """A1111's X/Y/Z plot script (`script_name`, `script_args` in 1.10's order): one queued plot, answered as
        A1111 answers it: the grids first (each with the plot's axes in its `parameters`), then each cell's image."""
        user = caller[len("user:") :] if caller.startswith("user:") else None
        with self.files.hold(pictures or {}) as held:
            given = {**asked.given, **held, "script_args": payload.get("script_args")}
            outcome = await self.queued.run(request, given, caller=caller, username=user, image_format="xyz")
        encoded = await asyncio.to_thread(lambda: [png_base64(path) for path in outcome.pngs])
        infotexts = [read_parameters(path) for path in outcome.pngs]
        stopped = outcome.status if outcome.stopped or "stopped" in outcome.status else None
        info = self._info(payload, asked, outcome.seed, len(outcome.pngs), infotexts, stopped)
        images = encoded if payload.get("send_images", True) is not False else []
        return JSONResponse({"images": images, "parameters": echo_parameters(payload), "info": json.dumps(info)})

    async def _generate(
        self, request: Request, caller: str, payload: dict, asked: A1111Request, pictures: dict | None = None
    ) -> JSONResponse:
        """Run as many queued calls as `asked.count` images need (`num_images` each: --images-per-device on every
        device), seeds consecutive; the last call's extra images are dropped."""
        per_call = self.engine.num_images
        user = caller[len("user:") :] if caller.startswith("user:") else None
        pngs: list[str] = []
        first_seed, status, started, interrupted = None, "", time.monotonic(), False
        with self.files.hold(pictures or {}) as held:
            given = {**asked.given, **held}
            for call in range(-(-asked.count // per_call)):
                if self.queued.interrupted_since(caller, started):  # between two calls: none of them to stop
                    status, interrupted = f"Stopped after {len(pngs)} images.", True
                    break
                if first_seed is not None:  # the next images: the seeds after the last call's
                    given.update(seed=(first_seed + call * per_call) % 2**32, randomize_seed=False)
                outcome = await self.queued.run(request, given, caller=caller, username=user, image_format="jpeg")
                status = outcome.status
                if outcome.stopped:
                    interrupted = True
                    break
                first_seed = outcome.seed if first_seed is None else first_seed
                pngs += outcome.pngs
        pngs = pngs[: asked.count]
        encoded = await asyncio.to_thread(lambda: [png_base64(path) for path in pngs])
        infotexts = [read_parameters(path) for path in pngs]
        info = self._info(payload, asked, first_seed, len(pngs), infotexts, status if interrupted else None)
        images = encoded if payload.get("send_images", True) is not False else []
        return JSONResponse({"images": images, "parameters": echo_parameters(payload), "info": json.dumps(info)})

    def _info(
        self,
        payload: dict,
        asked: A1111Request,
        seed: int | None,
        count: int,
        infotexts: list[str],
        interrupted: str | None,
    ) -> dict:
        """A1111's `info` (Processed.js()): what the images were made with, read back from their own parameters."""
        settings = parse_infotext(infotexts[0]).settings if infotexts else {}
        height, width = self.rules.sizes[0]
        size = settings.get("Size", f"{payload.get('width') or width}x{payload.get('height') or height}")
        width, _, height = size.partition("x")
        seeds = [(seed + i) % 2**32 for i in range(count)] if seed is not None else []
        prompt, negative = str(payload.get("prompt") or ""), str(payload.get("negative_prompt") or "")
        info = {
            "prompt": prompt,
            "all_prompts": [prompt] * count,
            "negative_prompt": negative,
            "all_negative_prompts": [negative] * count,
            "seed": seeds[0] if seeds else -1,
            "all_seeds": seeds,
            "subseed": -1,
            "all_subseeds": [-1] * count,
            "subseed_strength": 0,
            "width": int(width),
            "height": int(height),
            "sampler_name": settings.get("Sampler", asked.given.get("sampler")),
            "scheduler": asked.given.get("schedule_type", "Automatic"),
            "cfg_scale": float(settings.get("CFG scale", asked.given.get("guidance_scale", self.rules.guidance_scale))),
            "steps": int(settings.get("Steps", asked.given.get("steps", self.rules.steps))),
            "batch_size": count,
            "restore_faces": False,
            "sd_model_name": self.model,
            "sd_model_hash": None,
            "sd_vae_name": None,
            "sd_vae_hash": None,
            "seed_resize_from_w": -1,
            "seed_resize_from_h": -1,
            "denoising_strength": asked.given.get("strength"),
            "extra_generation_params": {},
            "index_of_first_image": 0,
            "infotexts": infotexts,
            "styles": payload.get("styles") or [],
            "job_timestamp": time.strftime("%Y%m%d%H%M%S"),
            "clip_skip": 1,
            "is_using_inpainting_conditioning": False,
            "version": "sdxl-jax",
        }
        if asked.ignored_scripts:
            info["comments"] = {
                "alwayson_scripts": f"ignored (not run by this server): {', '.join(asked.ignored_scripts)}"
            }
        if interrupted is not None:
            info["comments"] = {**info.get("comments", {}), "interrupted": interrupted}
        return info

    # ---- progress and interrupt ------------------------------------------------------------------------------------

    async def progress(self, request: Request, caller: str):
        """The caller's own request: its step, and the picture forming (a small JPEG) unless asked not to."""
        mine = self.queued.of_caller(caller)
        current = next((run for run in mine if not run.queued), mine[0] if mine else None)
        done = current.step / current.total if current and current.total else 0.0
        image = None
        if current and current.preview and request.query_params.get("skip_current_image", "").lower() != "true":
            image = await asyncio.to_thread(preview_base64, current.preview)
        state = {
            "skipped": False,
            "interrupted": False,
            "job": "txt2img" if current else "",
            "job_count": len(mine),
            "job_timestamp": "0",
            "job_no": 0,
            "sampling_step": current.step if current else 0,
            "sampling_steps": current.total if current else 0,
        }
        return JSONResponse(
            {"progress": done, "eta_relative": 0.0, "state": state, "current_image": image, "textinfo": None}
        )

    async def interrupt(self, request: Request, caller: str):
        self.queued.interrupt(caller)
        return JSONResponse({})

    # ---- the server's facts ----------------------------------------------------------------------------------------

    async def options(self, request: Request, caller: str):
        return JSONResponse(
            {
                "sd_model_checkpoint": self.model,
                "sd_checkpoint_hash": None,
                "sd_vae": "Automatic",
                "samples_format": "png",
                "CLIP_stop_at_last_layers": 1,
                "eta_noise_seed_delta": 0,
                "sd_lora": "None",
                "enable_pnginfo": True,
            }
        )

    async def set_options(self, request: Request, caller: str):
        """Any dict is accepted (clients post the whole options back); nothing this server has is changed by it, and
        a checkpoint other than the one served is refused (A1111 refuses one it does not have)."""
        payload = await json_object(request)
        wanted = payload.get("sd_model_checkpoint")
        if wanted is not None and str(wanted).split(" [")[0] != self.model:
            raise InvalidInput(f"This server serves the model '{self.model}' only; it cannot switch models.")
        return JSONResponse(None)

    async def samplers(self, request: Request, caller: str):
        return JSONResponse([{"name": name, "aliases": [], "options": {}} for name in sampler_choices()])

    async def schedulers(self, request: Request, caller: str):
        return JSONResponse(scheduler_items())

    async def sd_models(self, request: Request, caller: str):
        return JSONResponse(
            [
                {
                    "title": self.model,
                    "model_name": self.model,
                    "hash": None,
                    "sha256": None,
                    "filename": self.model,
                    "config": None,
                }
            ]
        )

    async def loras(self, request: Request, caller: str):
        return JSONResponse(
            [{"name": name, "alias": name, "path": f"{name}.safetensors", "metadata": {}} for name in self.rules.loras]
        )

    async def embeddings(self, request: Request, caller: str):
        return JSONResponse({"loaded": offered_embeddings(self.engine), "skipped": {}})

    async def prompt_styles(self, request: Request, caller: str):
        return JSONResponse(
            [
                {
                    "name": name,
                    "prompt": getattr(style, "prompt", ""),
                    "negative_prompt": getattr(style, "negative_prompt", ""),
                }
                for name, style in self.rules.styles.items()
            ]
        )

    async def upscalers(self, request: Request, caller: str):
        return JSONResponse(upscaler_items(self.rules))

    async def latent_upscale_modes(self, request: Request, caller: str):
        return JSONResponse(latent_upscale_items(self.rules))

    async def png_info(self, request: Request, caller: str):
        """A picture's `parameters` text, as A1111 reads it (and taken apart): read as the page's PNG Info reads a
        dropped file (its header and text, no pixels decoded), with the page's sentences; none is an empty answer."""
        payload = await json_object(request)
        text = parameters_text(decode_base64(payload.get("image"), "image"))
        info = parse_infotext(text) if text else None
        parameters = {"Prompt": info.prompt, "Negative prompt": info.negative_prompt, **info.settings} if info else {}
        return JSONResponse({"info": text, "items": {"parameters": text} if text else {}, "parameters": parameters})


def is_plot(payload: dict) -> bool:
    """Whether a txt2img/img2img payload asks for A1111's X/Y/Z plot script (its `script_name`, any case)."""
    return str(payload.get("script_name") or "").strip().lower() == SCRIPT_NAME


def a1111_error(status: int, message: str, kind: str) -> JSONResponse:
    """A refusal in A1111's shape, {"detail", "error"} (`kind`: "Refused" or "InvalidInput"); a 401 asks for Basic."""
    headers = {"WWW-Authenticate": "Basic"} if status == 401 else None
    return JSONResponse({"detail": message, "error": kind}, status, headers=headers)


async def json_object(request: Request) -> dict:
    """The request's JSON body, which must be an object (`guard.json_object`)."""
    return parse_json_object(await request.body())


def echo_parameters(payload: dict) -> dict:
    """`parameters` as A1111 echoes them: the request, pictures left out (they would double the answer)."""
    return {key: (None if key in ("init_images", "mask") else value) for key, value in payload.items()}


def inverted(mask: bytes) -> bytes:
    """A1111's inpainting_mask_invert: repaint what is black."""
    with Image.open(io.BytesIO(mask)) as image:
        flipped = ImageOps.invert(image.convert("L"))
    buffer = io.BytesIO()
    flipped.save(buffer, format="PNG")
    return buffer.getvalue()


def preview_base64(path: str) -> str | None:
    """The preview file as base64, or None when it was swept meanwhile."""
    try:
        return png_base64(path)
    except OSError:
        return None
