"""What the page's events and the API's endpoints run: one request in, images and a status line out.

    handlers = Handlers(engine, files=RunFiles(), outbox=Outbox())
    generate = handlers.endpoint()            # /generate: the page's Generate button, the examples, the API
    generate_png = handlers.endpoint("png")   # /generate_png: the same, answered with lossless PNGs

Every input is checked once, by `pipeline.request.parse_request` (the page and the API get the same sentences);
the engine runs the `Request` it returns. Stop (this session's flag), `job.cancel()` and a closed tab end a request
at its next denoising step.
"""

from __future__ import annotations

import contextvars
import logging
import pathlib
import threading
import time
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from pipeline.errors import InvalidInput
from pipeline.fields import DEFAULT_CFG_END, DEFAULT_DEEPCACHE
from pipeline.host.loop import Stopped
from pipeline.request import DEFAULT_STRENGTH, Request, RequestRules, parse_request
from pipeline.styles import DEFAULT_STYLE

from .delivery import Outbox
from .files import RunFiles
from .prompt_filter import PromptFilter
from .sessions import EarlyCancels, ShownImages, StopRequests, request_gone, session_of
from .sizes import size_label
from .texts import GENERATION_FAILED, NO_CFG_NOTE

logger = logging.getLogger("sdxl_jax.app")

#: Seconds the page's PNG event waits for a run's background PNGs before giving up on them.
PNG_WAIT_S = 120
#: What the answer's gallery holds: (file path, caption) per image.
Gallery = list[tuple[str, str]]


def invalid(exc: InvalidInput) -> gr.Error:
    """A refused input as the page and the API show it: one sentence, no traceback."""
    return gr.Error(str(exc), title="Invalid input", print_exception=False)


class Handlers:
    """The functions behind the page and the API, around one engine (a `Generator`, or the cluster's leader)."""

    def __init__(
        self,
        engine: Any,
        rules: RequestRules | None = None,
        *,
        files: RunFiles,
        outbox: Outbox,
        prompt_filter: PromptFilter | None = None,
        progress: bool = True,
    ) -> None:
        self.engine = engine
        self.rules = rules or engine.rules  # what a request may ask for (the page may offer its own styles)
        self.files = files
        self.outbox = outbox
        self.prompt_filter = prompt_filter
        self.progress = progress  # report "step k / N" on the page (--no-progress: not)
        self.stops = StopRequests()
        self.shown = ShownImages()
        self.early_cancels = EarlyCancels()  # its middleware is installed at launch (Page.launch)

    # ---- the endpoints ---------------------------------------------------------------------------------------------

    def endpoint(self, image_format: str | None = None):
        """The function Gradio calls for /generate (JPEG gallery files; PNGs follow in the background) or, with
        `image_format="png"`, for /generate_png. Its parameters are the API's, with this server's defaults."""
        rules = self.rules

        def generate(
            prompt: str,
            negative_prompt: str = "",
            style: str = DEFAULT_STYLE,
            guidance_scale: float = rules.guidance_scale,
            seed: int = 0,
            randomize_seed: bool = True,
            aspect_ratio: str = size_label(*rules.sizes[0]),
            steps: int = rules.steps,
            sampler: str = rules.sampler or "Euler",
            cfg_end: float = DEFAULT_CFG_END,
            deepcache: int = DEFAULT_DEEPCACHE,
            loras: list | None = None,
            init_image: dict | None = None,
            mask_image: dict | None = None,
            strength: float = DEFAULT_STRENGTH,
            picture: dict | None = None,  # the page's mask editor: the strokes painted over the picture
            request: gr.Request = None,  # Gradio's own injection: the caller's session (for the Stop button)
            progress: gr.Progress = gr.Progress(),  # noqa: B008  # Gradio's own injection: a live "step k / N" bar
        ) -> tuple[Gallery, int, str]:
            """Generate one image per accelerator core.

            `cfg_end` < 1 guides the first part of the steps only; `deepcache` N > 1 runs the whole UNet every N
            steps and its shallow part between: both faster, both change the picture (1 and 1: exact). `loras`:
            up to 4 [name, weight] pairs of the server's LoRAs (also `<lora:NAME:WEIGHT>` in the prompt).
            `init_image` (a file: image to image) and `mask_image` (white = repaint: inpainting), with `strength`
            (0 < s <= 1; int(steps × s) steps run).
            Returns the images (JPEG files with `parameters` in EXIF UserComment; PNGs with a `parameters` chunk from
            /generate_png), the seed used and a status line. Stop, `job.cancel()` or a closed page end the request
            at the next denoising step.
            """
            try:
                image, mask = file_path(init_image), file_path(mask_image)
                if picture is not None and image is not None and mask is None:
                    mask = painted_mask(picture)
                checked = parse_request(
                    prompt, negative_prompt, style, guidance_scale, seed, randomize_seed, size=aspect_ratio,
                    steps=steps, sampler=sampler, cfg_end=cfg_end, deepcache=deepcache, loras=loras,
                    init_image=image, mask_image=mask, strength=strength, rules=rules,
                    check_prompt=self.prompt_filter.check if self.prompt_filter else None,
                )  # fmt: skip
            except InvalidInput as exc:
                raise invalid(exc) from None
            ignored = not rules.cfg and (bool(checked_text(negative_prompt)) or guidance_scale != rules.guidance_scale)
            return self.run(checked, session_of(request), progress, image_format, cfg_ignored=ignored)

        return generate

    def example(self, seeds: dict[str, int], first_seed: int):
        """The examples' function: an example's fixed seed (shown in the seed box), the server's steps and sampler;
        "Randomize seed" stays as the visitor left it."""
        generate = self.endpoint()

        def generate_example(text, negative_text, style_name, scale, ratio, progress=gr.Progress()):  # noqa: B008
            return generate(text, negative_text, style_name, scale, seeds.get(text, first_seed), False, ratio,
                            progress=progress)  # fmt: skip

        return generate_example

    @staticmethod
    def picked_loras(*rows) -> list:
        """The page's LoRA picker (name, weight, name, weight, ...) as the API's `loras`: [[name, weight], ...]."""
        return [[name, weight] for name, weight in zip(rows[0::2], rows[1::2], strict=True) if name]

    def select(self, evt: gr.SelectData, request: gr.Request = None) -> None:
        """Remember the gallery image this session clicked: what Vary starts from."""
        path = (evt.value or {}).get("image", {}).get("path") if isinstance(evt.value, dict) else None
        self.shown.select(session_of(request), pathlib.Path(path).name if path else None)

    def vary(self, strength: float):
        """A Vary button: the session's selected result (its lossless PNG) as the picture to start from, at
        `strength` (Fooocus' subtle 0.5 and strong 0.85); one sentence when no result is selected."""

        def start_from(request: gr.Request = None):
            name = self.shown.selected(session_of(request))
            future = self.outbox.png_for(name) if name else None
            try:
                path = str(future.result(timeout=PNG_WAIT_S)) if future is not None else None
            except Exception:  # a PNG that failed: nothing to start from
                logger.exception("a background PNG failed")
                path = None
            if not path:
                raise gr.Error("Click an image of the gallery first, then Vary.", title="Nothing to vary",
                               print_exception=False)  # fmt: skip
            return path, Handlers.paint_on(path), strength

        return start_from

    @staticmethod
    def paint_on(path: str | None) -> dict | None:
        """The mask editor's value for a picture: the picture as its background, nothing painted yet."""
        return {"background": path, "layers": [], "composite": path} if path else None

    def pngs(self, request: gr.Request = None) -> dict:
        """The page's follow-up to a generation: the lossless PNG (with `parameters`) of each image it just showed.

        Runs as its own event once the answer is in, so the answer never waits for PNG encoding. Images are matched
        by file name (web/delivery.py); no path a browser sends is ever opened.
        """
        futures = [self.outbox.png_for(name) for name in self.shown.names(session_of(request))]
        paths = []
        for future in futures:
            try:
                path = future.result(timeout=PNG_WAIT_S) if future is not None else None
            except Exception:  # a PNG that failed or timed out is left out; the JPEG still shows
                logger.exception("a background PNG failed")
                path = None
            if path is not None and pathlib.Path(path).is_file():
                paths.append(str(path))
        return gr.update(value=paths or None, visible=bool(paths))

    def stop(self, request: gr.Request) -> None:
        """The Stop button: this session's running request ends at its next step (it answers "Stopped at ...")."""
        self.stops.stop(session_of(request))

    # ---- one request -----------------------------------------------------------------------------------------------

    def run(
        self, request: Request, session: str, progress, image_format: str | None = None, *, cfg_ignored: bool = False
    ) -> tuple[Gallery, int, str]:
        """Run a checked request on the engine and deliver its files; the gallery, the seed and the status line."""
        # Step reports come from the device runtime's threads; gr.Progress finds its request through context
        # variables, so each report runs in a copy of this request's context (one at a time).
        context, context_lock = contextvars.copy_context(), threading.Lock()

        def on_step(step: int, total: int) -> None:
            with context_lock:
                context.run(progress, (step, total), desc=f"step {step} / {total}", unit="steps")

        stop = self.stops.begin(session)
        started = time.perf_counter()

        def should_stop() -> bool:
            return stop() or request_gone() or self.early_cancels.take(session)

        try:
            result = self.engine.generate(request, on_step if self.progress else None, should_stop=should_stop)
            delivery = self.outbox.deliver(result.images, self.files.new_dir(), f"sdxl-{request.seed}", image_format)
            self.shown.remember(session, delivery.gallery)
        except Stopped as stopped:
            logger.info("request %s (seed %d)", stopped, request.seed)
            # Nothing of the stopped request is shown: the gallery, its PNGs and the seed box keep the last images'.
            shown = " The images are still the previous request's." if self.shown.names(session) else ""
            return gr.skip(), gr.skip(), f"Stopped at step {stopped.done} / {stopped.total}.{shown}"
        except Exception:
            logger.exception("generation failed (seed %d, style %s)", request.seed, request.style)
            raise gr.Error(GENERATION_FAILED, print_exception=False) from None  # logged above
        finally:
            self.stops.end(session, stop)
        elapsed = time.perf_counter() - started
        paths = delivery.gallery
        engine_s = float(result.timings.get("total_s", elapsed))
        height, width = request.size
        logger.info(
            "generated %d images: seed %d, style %s, guidance %g, %d steps %s, engine %.2f s, %s files %.0f ms, "
            "in all %.2f s",
            len(paths), request.seed, request.style, request.guidance_scale, result.steps, result.sampler, engine_s,
            paths[0].suffix if paths else "no", delivery.host_s * 1000, elapsed,
        )  # fmt: skip
        status = status_line(len(paths), engine_s, request, result.steps, result.sampler)
        # Only an API caller can send them; gradio_client sends the page's defaults unasked, so only say it for others.
        if cfg_ignored:
            status += f" · {NO_CFG_NOTE}"
        if result.truncated:
            gr.Warning(result.truncated)
            status += f"\n\n⚠️ {result.truncated}"
        captions = [f"seed {s} · {width}×{height}" for s in result.seeds]
        return [(str(p), c) for p, c in zip(paths, captions, strict=True)], request.seed, status


def file_path(payload: object) -> str | None:
    """The server path of an uploaded file as Gradio hands it over (its cache: Gradio refuses any other path)."""
    if isinstance(payload, dict):
        return payload.get("path") or None
    return payload or None if isinstance(payload, str) else None


def painted_mask(payload: dict) -> Image.Image | None:
    """The mask the strokes painted in the page's editor make: white where painted; None when nothing was."""
    painted = None
    for layer in payload.get("layers") or []:
        path = file_path(layer)
        if path is None:
            continue
        with Image.open(path) as image:
            alpha = np.asarray(image.convert("RGBA"))[..., 3] > 0  # [H, W]: where a stroke is
        painted = alpha if painted is None else painted | alpha
    if painted is None or not painted.any():
        return None
    return Image.fromarray(painted.astype(np.uint8) * 255)


def status_line(count: int, seconds: float, request: Request, steps: int, sampler: str) -> str:
    """e.g. "8 images in 2.3 s · 1024×1024 · 25 steps, Euler · seed 1234" (+ " · CFG end 0.5 · DeepCache 3")."""
    height, width = request.size
    steps_text = f"{steps} step{'s' if steps != 1 else ''}, {sampler}"
    levers = (f" · CFG end {request.cfg_end:g}" if request.cfg_end != DEFAULT_CFG_END else "") + (
        f" · DeepCache {request.deepcache}" if request.deepcache != DEFAULT_DEEPCACHE else "")  # fmt: skip
    if request.init_image is not None:
        levers += f" · {'inpainted' if request.mask_image is not None else 'from a picture'}, strength " \
            f"{request.strength:g}"  # fmt: skip
    if request.loras:
        levers += " · LoRA " + ", ".join(
            f"{name} {te:g}" if te == unet else f"{name} {te:g}/{unet:g}" for name, te, unet in request.loras)
    return f"{count} image{'s' if count != 1 else ''} in {seconds:.1f} s · {width}×{height} · {steps_text} · " \
        f"seed {request.seed}{levers}"  # fmt: skip


def checked_text(value: object) -> str:
    """A raw text input's words ("" for anything else): whether an API caller sent a negative prompt at all."""
    return " ".join(value.split()) if isinstance(value, str) else ""
