"""What the page's events and the API's endpoints run: one request in, images and a status line out.

    handlers = Handlers(engine, files=RunFiles(), outbox=Outbox())
    generate = handlers.endpoint()            # /generate: the page's Generate button, the examples, the API
    generate_png = handlers.endpoint("png")   # /generate_png: the same, answered with lossless PNGs

Every input is checked once, by `pipeline.contract.request.parse_request` (the page and the API get the same sentences);
the engine runs the `Request` it returns. Stop (this session's flag), `job.cancel()` and a closed tab end a request
at its next denoising step.
"""

from __future__ import annotations

import contextvars
import inspect
import io
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from pipeline.contract.engine import Engine, EngineResult
from pipeline.contract.errors import EngineUnavailable, InvalidInput
from pipeline.contract.fields import FIELDS, PLAIN
from pipeline.contract.image_inputs import open_image
from pipeline.contract.parameters import status_size, status_steps
from pipeline.contract.request import Request, RequestRules, parse_request
from pipeline.contract.stopping import Stopped
from pipeline.contract.xyz_plot import MAX_CELLS

from ..gradio_internals import request_gone
from ..serving.outbox import Outbox
from ..serving.temp_files import RunFiles
from ..serving.twin_routing import TwinRouting
from .examples import ExampleCache
from .prompt_filter import PromptFilter
from .sessions import EarlyCancels, ShownImages, StopRequests, session_of
from .size_labels import size_label
from .texts import GENERATION_FAILED, NO_CFG_NOTE, SERVER_STOPPING

logger = logging.getLogger("sdxl_jax.app")

#: Seconds the page's PNG event waits for a run's background PNGs before giving up on them.
PNG_WAIT_S = 120
#: JPEG quality of the live previews (at latent size: 128×128 for a 1024×1024 image, a few KB each).
PREVIEW_QUALITY = 85
#: What the answer's gallery holds: (file path, caption) per image.
Gallery = list[tuple[str, str]]


def invalid(exc: InvalidInput, labels: Mapping[str, str] | None = None) -> gr.Error:
    """A refused input as the page and the API show it: one sentence, no traceback. `labels` (the page's: field ->
    its control's label): the fields it names are called as the page shows them, not by their API names."""
    return gr.Error(exc.named(labels) if labels else str(exc), title="Invalid input", print_exception=False)


class Handlers:
    """The functions behind the page and the API, around one engine (a `Generator`, or the cluster's leader)."""

    def __init__(
        self,
        engine: Engine,
        rules: RequestRules | None = None,
        *,
        files: RunFiles,
        outbox: Outbox,
        prompt_filter: PromptFilter | None = None,
        progress: bool = True,
        on_finished: Callable[[Finished], None] | None = None,
        xyz_max_cells: int = MAX_CELLS,
    ) -> None:
        self.engine = engine
        self.xyz_max_cells = xyz_max_cells  # the most cells an X/Y/Z plot may have (--xyz-max-cells)
        self.rules = rules or engine.rules  # what a request may ask for (the page may offer its own styles)
        self.files = files
        self.outbox = outbox
        self.prompt_filter = prompt_filter
        self.progress = progress  # report "step k / N" on the page (--no-progress: not)
        self.on_finished = on_finished  # told of every delivered request (the history keeps it)
        self.stops = StopRequests()
        self.shown = ShownImages()
        self.early_cancels = EarlyCancels()  # its middleware is installed at launch (Page.launch)
        self.twin_routing = TwinRouting()  # /generate without previews, to a plain twin (middleware: Page.launch)
        self.shutting_down = threading.Event()  # the server is stopping: requests end at their next step, saying why
        # engines that can wait for one another (web/engines/remote.py) say what a request waits for: the page shows it
        self.engine_waits = "on_wait" in inspect.signature(engine.generate).parameters
        self._running = 0  # requests in `run` now (shut_down waits for them to answer)
        self._idle = threading.Condition()

    # ---- the endpoints ---------------------------------------------------------------------------------------------

    def endpoint(
        self, image_format: str | None = None, *, streams: bool = True, labels: Mapping[str, str] | None = None
    ):
        """The function Gradio calls for /generate (JPEG gallery files; PNGs follow in the background) or, with
        `image_format="png"`, for /generate_png. Its parameters are the API's: the request fields' table
        (`pipeline.contract.fields.FIELDS`), with this server's defaults, then the page's own.

        `streams=False`: a plain function that returns the answer alone, no previews. gradio_client downloads every
        file of every message a stream sends, and a generator's last message is sent twice (streamed, then as the
        answer), so a streamed answer's images are fetched twice; a call that wants nothing before its answer is
        served this way (/generate_png, and /generate with `previews=False`: web/serving/twin_routing.py).

        `labels`: the page's events' (field -> its control's label), so a refusal names a field as the page shows it
        ("Upscale by 3 ..."); the API's endpoints have none and name it as their callers pass it ("hires_scale 3 ...").
        """
        signature = api_signature(self.rules)

        def generate(*args, **kwargs) -> Iterator[tuple[Gallery, int, str]]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            given, request = bound.arguments, bound.arguments["request"]
            try:
                checked = self.request_of(given)
            except InvalidInput as exc:
                raise invalid(exc, labels) from None
            yield from self.run(
                checked,
                session_of(request),
                given["progress"],
                image_format,
                user=getattr(request, "username", None),
                previews=streams and given["previews"] is not False,
            )

        def answer(*args, **kwargs) -> tuple[Gallery, int, str]:
            messages = list(generate(*args, **kwargs))  # no previews: the answer alone (or a stopped request's)
            return messages[-1]

        function = generate if streams else answer
        function.__signature__ = signature
        function.__annotations__ = {name: parameter.annotation for name, parameter in signature.parameters.items()}
        function.__doc__ = API_DOC
        return function

    def request_of(self, given: Mapping[str, object]) -> Request:
        """The request the endpoint's arguments `given` (by the API's names) ask for, every field checked once
        (`parse_request`): the uploaded files by their paths; the mask, when none was uploaded, the strokes painted
        in the editor over the picture. Raises InvalidInput."""
        image, mask = file_path(given["init_image"]), file_path(given["mask_image"])
        if given["picture"] is not None and image is not None and mask is None:
            mask = painted_mask(given["picture"])
        return parse_request(
            given["prompt"],
            given["negative_prompt"],
            given["style"],
            seed=given["seed"],
            randomize_seed=given["randomize_seed"],
            size=given["aspect_ratio"],
            loras=given["loras"],
            init_image=image,
            mask_image=mask,
            controlnets=given["controlnets"],
            ip_images=given["ip_images"],
            outpaint=given["outpaint"],
            regions=given["regions"],
            region_mask=file_path(given["region_mask"]),
            rules=self.rules,
            check_prompt=self.prompt_filter.check if self.prompt_filter else None,
            **{row.name: given[row.name] for row in PLAIN},
        )

    def example(self, seeds: dict[str, int], first_seed: int, labels: Mapping[str, str] | None = None):
        """The examples' function: an example's fixed seed (shown in the seed box), the server's steps and sampler;
        "Randomize seed" stays as the visitor left it. An example's finished answer is kept (web/page/examples.py): the
        next click on it, from anyone, shows those images without generating."""
        generate = self.endpoint(labels=labels)
        cache = ExampleCache(self.files.root / "examples")

        def generate_example(
            text,
            negative_text,
            style_name,
            scale,
            ratio,
            request: gr.Request = None,
            progress=gr.Progress(),  # noqa: B008
        ):
            key = (text, negative_text, style_name, scale, ratio)
            if (kept := cache.get(key)) is not None:
                yield kept
                return
            answer = None
            for answer in generate(
                text,
                negative_text,
                style_name,
                scale,
                seeds.get(text, first_seed),
                False,
                ratio,
                previews=True,
                request=request,
                progress=progress,
            ):
                yield answer
            if answer is not None and isinstance(answer[1], int):  # finished (previews and a Stop skip the seed)
                cache.keep(key, answer)

        return generate_example

    @staticmethod
    def picked_loras(*rows) -> list:
        """The page's LoRA picker (name, weight, name, weight, ...) as the API's `loras`: [[name, weight], ...]."""
        return [[name, weight] for name, weight in zip(rows[0::2], rows[1::2], strict=True) if name]

    def select(self, evt: gr.SelectData, request: gr.Request = None) -> None:
        """Remember the gallery image this session clicked: what Vary starts from."""
        path = (evt.value or {}).get("image", {}).get("path") if isinstance(evt.value, dict) else None
        self.shown.select(session_of(request), pathlib.Path(path).name if path else None)

    def selected_png(self, request: gr.Request = None, *, then: str = "Vary") -> str:
        """The lossless PNG of the gallery image this session clicked: what Vary and "Use as picture" start from;
        one sentence (naming the button, `then`) when none is selected or its PNG failed."""
        name = self.shown.selected(session_of(request))
        future = self.outbox.png_for(name) if name else None
        try:
            path = str(future.result(timeout=PNG_WAIT_S)) if future is not None else None
        except Exception:  # a PNG that failed: nothing to start from
            logger.exception("a background PNG failed")
            path = None
        if not path:
            raise gr.Error(
                f"Click an image of the gallery first, then {then}.", title="No image selected", print_exception=False
            )
        return path

    def keep_selected(self, request: gr.Request = None) -> str:
        """ "Use as picture"'s first step: the selected result's PNG into a State (a refusal marks no input), which
        `use_picture` then puts in place."""
        return self.selected_png(request, then='"Use as picture"')

    def vary(self, strength: float):
        """A Vary button: (the session's selected result's lossless PNG, `strength`: Fooocus' subtle 0.5 and strong
        0.85) for the one generation Vary runs. Only States take them, never the picture inputs: Vary is one-shot
        (the next Generate draws from the prompt again, unless a picture is in "Start from a picture"), and a Vary
        refused for want of a selection marks no input with an error badge or a spinner."""

        def start_from(request: gr.Request = None) -> tuple[str, float]:
            return self.selected_png(request), strength

        return start_from

    @staticmethod
    def use_picture(path: str | None):
        """ "Use as picture" (A1111's "Send to img2img"), once `selected_png` found the picture: it goes into "Start
        from a picture", the mask editor and the chip beside Generate, and every Generate starts from it until its ✕.
        Outputs: the picture, the mask editor, the chip, the chip's thumbnail."""
        return path, Handlers.paint_on(path), gr.update(visible=bool(path)), path

    @staticmethod
    def drop_picture():
        """The chip's ✕: no picture to start from (the next Generate draws from the prompt alone); the same outputs
        as `use_picture`."""
        return Handlers.use_picture(None)

    @staticmethod
    def picture_uploaded(payload: dict | None):
        """The picture's change, given its upload as sent (the event does not preprocess: Gradio's own decoding of a
        non-image ends in a long traceback and a bare "Error" badge): (the picture, the mask editor's value, the chip
        beside Generate, its thumbnail), or one sentence, one log line and all cleared when the file is not a
        picture this server reads. The chip shows whenever a picture is in use, so no Generate starts from a picture
        the user cannot see (the section it sits in is two closed accordions deep)."""
        path = file_path(payload)
        if path is None:
            return Handlers.drop_picture()
        try:
            open_image(path, what="image").close()  # as the APIs name it: one sentence
        except InvalidInput as exc:
            logger.info("a picture upload was refused: %s", exc)
            gr.Warning(str(exc), title="Not a picture")
            return Handlers.drop_picture()
        return gr.skip(), Handlers.paint_on(path), gr.update(visible=True), path

    @staticmethod
    def paint_on(path: str | None) -> dict | None:
        """The mask editor's value for a picture: the picture as its background, nothing painted yet."""
        return {"background": path, "layers": [], "composite": path} if path else None

    def pngs(self, request: gr.Request = None) -> dict:
        """The page's follow-up to a generation: the lossless PNG (with `parameters`) of each image it just showed.

        Runs as its own event once the answer is in, so the answer never waits for PNG encoding. Images are matched
        by file name (web/serving/outbox.py); no path a browser sends is ever opened.
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

    @property
    def running(self) -> int:
        """Requests in `run` now: on the devices, waiting for them, or delivering their files."""
        with self._idle:
            return self._running

    def shut_down(self, timeout: float) -> bool:
        """The server is stopping: every running request ends at its next step and answers SERVER_STOPPING (an API
        client gets that sentence, not a dropped connection); a request that starts from now on answers it at once.
        Waits up to `timeout` s for them to answer; True if they all did."""
        self.shutting_down.set()
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout)

    # ---- one request -----------------------------------------------------------------------------------------------

    def run(
        self,
        request: Request,
        session: str,
        progress,
        image_format: str | None = None,
        *,
        user: str | None = None,
        previews: bool = True,
    ) -> Iterator[tuple]:
        """Run a checked request on the engine and deliver its files: yields the pictures forming (previews, when the
        engine makes them, `image_format` is None and `previews`), then the answer: the gallery, the seed and the
        status line.

        The engine runs in a worker thread (in this request's context: a cancel or a closed page still reaches it)
        while this generator hands each newest preview to Gradio; a preview Gradio has not taken yet is replaced by
        the next, so a slow browser never holds up the devices.
        """
        if self.shutting_down.is_set():
            raise gr.Error(SERVER_STOPPING.format(at=""), title="Server stopping", print_exception=False)
        with self._idle:
            self._running += 1
        try:
            yield from self._run(request, session, progress, image_format, user=user, previews=previews)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _run(
        self, request: Request, session: str, progress, image_format: str | None, *, user: str | None, previews: bool
    ) -> Iterator[tuple]:
        """The engine's run, its previews streamed, then the stopped request's answer or the finished one's."""
        stop = self.stops.begin(session)
        closed = threading.Event()  # set when Gradio closes this generator (a cancel): the engine stops too
        started = time.perf_counter()
        forming = LatestPreview() if image_format is None and previews else None
        reported: list[tuple[int, int]] = []  # the last step reported (a preview's message is followed by it again)
        on_step, on_wait = _reporters(progress, reported)
        worker = self._start(
            request,
            session,
            on_step,
            on_wait,
            forming,
            lambda: closed.is_set() or stop() or self.shutting_down.is_set(),
        )
        previewed = False  # whether the gallery now shows this request's previews
        failure = None  # the error the request answers, after its previews gave way
        try:
            while (shown := (forming.take() if forming is not None else None)) is not None:
                previewed = True
                yield self._previews(request, *shown), gr.skip(), gr.skip()
                if reported:  # a client's job.status() shows the last message: a preview's carries no progress
                    on_step(*reported[0])
            result = worker.result()
        except Stopped as stopped:
            logger.info("request %s (seed %d)", stopped, request.seed)
            result = stopped
        except GeneratorExit:  # Gradio closed the stream (a cancel while previews showed): the engine stops too
            closed.set()
            worker.join()
            if isinstance(stopped := worker.exception(), Stopped):
                logger.info("request %s (seed %d)", stopped, request.seed)
            raise
        except EngineUnavailable as exc:  # an engine died or none is ready: expected, its sentence says what happened
            logger.warning("request failed (seed %d): %s", request.seed, exc)
            logger.debug("the failed request's traceback (seed %d)", request.seed, exc_info=True)
            failure = gr.Error(str(exc), title="No engine", print_exception=False)
        except Exception:  # a bug: its traceback at ERROR
            logger.exception("generation failed (seed %d, style %s)", request.seed, request.style)
            failure = gr.Error(GENERATION_FAILED, print_exception=False)  # logged above
        finally:
            closed.set()
            worker.join()
            self.stops.end(session, stop)
        if failure is not None:
            if previewed:  # no dead request's preview stays: the last images again, else an empty gallery
                yield self.shown.gallery(session), gr.skip(), gr.skip()
            raise failure
        if isinstance(result, Stopped) and self.shutting_down.is_set():
            at = f" at step {result.done} / {result.total}"
            raise gr.Error(SERVER_STOPPING.format(at=at), title="Server stopping", print_exception=False)
        if isinstance(result, Stopped):
            yield self._stopped(result, session, previewed)
        else:
            yield self._answer(request, result, session, user, image_format, started)

    def _start(
        self,
        request: Request,
        session: str,
        on_step: Callable[[int, int], None],
        on_wait: Callable[[str], None],
        forming: LatestPreview | None,
        stopped: Callable[[], bool],
    ) -> EngineRun:
        """The engine's call in its own thread (in a copy of this request's context): steps reported, stopped by
        Stop, a cancel, a closed page or the server stopping between steps, previews handed to `forming`, what it
        waits for reported (engines that wait for one)."""

        def should_stop() -> bool:
            return stopped() or request_gone() or self.early_cancels.take(session)

        return EngineRun(
            lambda: self.engine.generate(
                request,
                on_step if self.progress else None,
                should_stop=should_stop,
                **({"on_preview": forming.put} if forming is not None else {}),
                **({"on_wait": on_wait} if self.engine_waits else {}),
            ),
            contextvars.copy_context(),
            on_done=forming.finish if forming is not None else None,
        )

    def _previews(self, request: Request, done: int, total: int, pixels: np.ndarray) -> Gallery:
        """The gallery of the pictures forming: one small JPEG per image, captioned with the step and the pass's
        size (the hires fix's second pass: its scale, the hires size being the engine's to round)."""
        height, width = request.size
        second = request.hires_scale != 1.0 and done > total - request.hires_steps_run()
        caption = f"step {done} / {total} · " + (f"hires ×{request.hires_scale:g}" if second else f"{width}×{height}")
        return [(str(self._preview_file(image)), caption) for image in pixels]

    def _stopped(self, stopped: Stopped, session: str, previewed: bool) -> tuple:
        """A stopped request's answer: the gallery goes back from the previews to the last images, if any, else
        keeps the last preview; the PNGs and the seed box keep the last images'."""
        before = self.shown.gallery(session)
        note = (
            " The images are still the previous request's."
            if before
            else " The pictures are its last preview."
            if previewed
            else ""
        )
        gallery = before if previewed and before else gr.skip()
        return gallery, gr.skip(), f"Stopped at step {stopped.done} / {stopped.total}.{note}"

    def _answer(
        self,
        request: Request,
        result: EngineResult,
        session: str,
        user: str | None,
        image_format: str | None,
        started: float,
    ) -> tuple:
        """A finished request's answer: its files written (web/serving/outbox.py), the history told, the status line."""
        try:
            delivery = self.outbox.deliver(result.images, self.files.new_dir(), f"sdxl-{request.seed}", image_format)
        except Exception:
            logger.exception("writing the images failed (seed %d)", request.seed)
            raise gr.Error(GENERATION_FAILED, print_exception=False) from None
        final = result_size(result, request)
        captions = [f"seed {s} · {status_size(final)}" for s in result.seeds]  # the images' size (hires: the larger)
        gallery = [(str(p), c) for p, c in zip(delivery.gallery, captions, strict=True)]
        self.shown.remember(session, delivery.gallery, gallery)
        if self.on_finished is not None:
            self.on_finished(Finished(request, result, delivery, session, user))
        elapsed = time.perf_counter() - started
        paths = delivery.gallery
        engine_s = float(result.timings.get("total_s", elapsed))
        logger.info(
            "generated %d images: seed %d, style %s, guidance %g, %d steps %s, engine %.2f s, %s files %.0f ms, "
            "in all %.2f s",
            len(paths),
            request.seed,
            request.style,
            request.guidance_scale,
            result.steps,
            result.sampler,
            engine_s,
            paths[0].suffix if paths else "no",
            delivery.host_s * 1000,
            elapsed,
        )
        status = status_line(len(paths), engine_s, request, result.steps, result.sampler, final)
        # Only an API caller can send them; gradio_client sends the page's defaults unasked, so only say it for others.
        if request.ignored:
            status += f" · {NO_CFG_NOTE}"
        if result.truncated:
            gr.Warning(result.truncated)
            status += f"\n\n⚠️ {result.truncated}"
        return gallery, request.seed, status

    def _preview_file(self, pixels: np.ndarray) -> pathlib.Path:
        """One preview (uint8 [h, w, 3] at latent size) as a small JPEG file (see RunFiles.content_file)."""
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=PREVIEW_QUALITY)
        return self.files.content_file(buffer.getvalue(), ".jpg")


@dataclass(frozen=True)
class Finished:
    """A request that ran to its end and was delivered: what the history keeps (web/history/tab.py)."""

    request: Request  # what was asked
    result: EngineResult  # steps, sampler, seeds
    delivery: Any  # web/serving/outbox.Delivery: the gallery's files (and their PNGs, in the background)
    session: str  # the browser session that asked
    user: str | None  # the signed-in user (None without logins)


class LatestPreview:
    """The newest preview of a running request, handed from the engine's thread to the page's generator.

    Only the newest counts: one that was not taken before the next arrives is dropped, so neither the devices nor
    the engine's thread ever wait for a browser.
    """

    def __init__(self) -> None:
        self._latest: tuple[int, int, np.ndarray] | None = None
        self._finished = False
        self._changed = threading.Condition()

    def put(self, done: int, total: int, pixels: np.ndarray) -> None:
        """The engine's listener: (steps done, total steps, uint8 [b, h, w, 3])."""
        with self._changed:
            self._latest = (done, total, pixels)
            self._changed.notify_all()

    def finish(self) -> None:
        """The run is over (answered, stopped or failed): `take` returns at once, not at its next poll."""
        with self._changed:
            self._finished = True
            self._changed.notify_all()

    def take(self) -> tuple[int, int, np.ndarray] | None:
        """The next preview, waiting for it; None once the run has finished and no preview is left."""
        with self._changed:
            while self._latest is None and not self._finished:
                self._changed.wait()
            shown, self._latest = (None if self._finished else self._latest), None
        return shown  # none once the run is over: its answer comes next


class EngineRun:
    """One engine call in its own thread, in a given context: `done` is set when it returns or raises."""

    def __init__(self, call, context: contextvars.Context, on_done: Callable[[], None] | None = None) -> None:
        self.done = threading.Event()
        self._on_done = on_done  # told when the call returns or raises (after `done` is set)
        self._outcome: tuple[bool, Any] | None = None
        self._thread = threading.Thread(target=context.run, args=(self._run, call), name="engine-run", daemon=True)
        self._thread.start()

    def _run(self, call) -> None:
        try:
            self._outcome = (True, call())
        except BaseException as exc:  # handed to the waiting generator, which raises it there
            self._outcome = (False, exc)
        finally:
            self.done.set()
            if self._on_done is not None:
                self._on_done()

    def result(self):
        """The call's value (waiting for it), or its exception raised here."""
        self.done.wait()
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    def join(self) -> None:
        self._thread.join()

    def exception(self) -> BaseException | None:
        """What the call raised (None while it runs, or when it returned)."""
        ok, value = self._outcome or (True, None)
        return None if ok else value


def _reporters(progress, reported: list) -> tuple[Callable[[int, int], None], Callable[[str], None]]:
    """The engine's `on_step` ("step k / N" on Gradio's bar, the last step kept in `reported`) and `on_wait` (what
    the request waits for, as the bar's text, no bar). gr.Progress finds its request through context variables:
    reports run in a copy of this context, one at a time (the engine runs in another: a context can be entered by
    one thread at a time)."""
    progress_context, context_lock = contextvars.copy_context(), threading.Lock()

    def on_step(step: int, total: int) -> None:
        with context_lock:
            reported[:] = [(step, total)]
            progress_context.run(progress, (step, total), desc=f"step {step} / {total}", unit="steps")

    def on_wait(text: str) -> None:
        with context_lock:
            progress_context.run(progress, None, desc=text)

    return on_step, on_wait


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


def result_size(result: EngineResult, request: Request) -> tuple[int, int]:
    """(height, width) of a result's images: the request's size, or with the hires fix the larger one."""
    return (result.images[0].height, result.images[0].width) if result.images else request.size


def status_line(
    count: int, seconds: float, request: Request, steps: int, sampler: str, final: tuple[int, int] | None = None
) -> str:
    """e.g. "8 images in 2.3 s · 1024×1024 · 25 steps, Euler · seed 1234", then the request's other settings (the
    table's fields away from their default, its picture, its LoRAs). `steps`: all that ran; `final`: the images'
    (height, width). With the hires fix both passes are said: "256×256 (hires ×2 from 128×128) · 4 + 4 steps"."""
    second = request.hires_steps_run()
    size = status_size(request.size, final, request.hires_scale)
    steps_text = f"{status_steps(steps - second, second)}, {sampler}"
    levers = request.status_text()
    if request.loras:
        levers += " · LoRA " + ", ".join(
            f"{name} {te:g}" if te == unet else f"{name} {te:g}/{unet:g}" for name, te, unet in request.loras
        )
    return (
        f"{count} image{'s' if count != 1 else ''} in {seconds:.1f} s · {size} · {steps_text} · "
        f"seed {request.seed}{levers}"
    )


def api_defaults(rules: RequestRules) -> dict[str, Any]:
    """Each request field's default as the API offers it: this server's (guidance, size, steps, sampler), else the
    table's."""
    defaults = {row.name: getattr(rules, row.rule) if row.rule else row.default for row in FIELDS}
    return {**defaults, "aspect_ratio": size_label(*rules.sizes[0]), "sampler": rules.sampler or "Euler"}


def api_signature(rules: RequestRules) -> inspect.Signature:
    """The API's parameters: the request fields in the table's order with this server's defaults, then the page's
    mask editor and Gradio's own injections (the caller's session, for Stop; a live "step k / N" bar)."""
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    defaults = api_defaults(rules)
    parameters = [
        inspect.Parameter(
            row.name,
            keyword,
            default=inspect.Parameter.empty if row.name == "prompt" else defaults[row.name],
            annotation=row.api_type,
        )
        for row in FIELDS
    ]
    return inspect.Signature(
        [
            *parameters,
            # True: the pictures forming streamed before the answer (the page asks for them; previews are for eyes)
            inspect.Parameter("previews", keyword, default=False, annotation=bool),
            inspect.Parameter(
                "picture", keyword, default=None, annotation=dict | None
            ),  # strokes painted on the picture
            inspect.Parameter("request", keyword, default=None, annotation=gr.Request),
            inspect.Parameter("progress", keyword, default=gr.Progress(), annotation=gr.Progress),
        ]
    )


#: The API's request parameters as its docstrings list them (gradio_client's view_api, MCP's tools): one line per
#: request field of the table.
FIELD_DOC_LINES = [f"    {row.name}: {row.help}" + (f" ({row.values_text})" if row.plain else "") for row in FIELDS]

#: The API's docstring (gradio_client's view_api): the endpoint, then one line per request field of the table.
API_DOC = "\n".join(
    [
        "Generate one image per accelerator core (N with the server's --images-per-device N), seeds consecutive.",
        "",
        "Returns the images (JPEG files with `parameters` in EXIF UserComment; PNGs with a `parameters` chunk from "
        "/generate_png), the seed used and a status line. With previews=True, /generate first streams the images "
        "forming every 2 steps (small previews; the seed and status unchanged), unless the server runs with "
        "--no-previews. Stop, `job.cancel()` or a closed page end the request at the next denoising step.",
        "",
        "Parameters:",
        *FIELD_DOC_LINES,
        "    previews: True = the pictures forming streamed before the answer (the client fetches every preview's "
        "files); default False: no preview program run, the answer alone (each file fetched once)",
    ]
)
