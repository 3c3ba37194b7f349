"""The APIs' requests go through the page's own Gradio queue: the same function, limits, filter and checks.

Why through the queue and not by calling the engine: the page's Generate and the API's /generate run in Gradio's
"generate" concurrency group (`web/page/layout.generate_concurrency` at once) behind a bounded queue (`--queue-size`);
the handler (`web/page/handlers.Handlers.endpoint`) checks every field with `parse_request`, applies the prompt filter,
reports progress, honours Stop and keeps the history. An HTTP route that called the engine itself would be a back
door around all of that (and around a remote engine once the page fronts one). So each API request is pushed into
Gradio's queue in-process (web/gradio_internals.EventQueue), exactly as Gradio's own `/gradio_api/call/{api_name}`
route does, as an event of two hidden page events registered here in the same concurrency group, and its messages are
read from the queue's per-session stream. A full queue answers 503; a refusal comes back as the handler's one sentence.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from pipeline.contract.fields import FIELDS
from pipeline.contract.xyz_plot import SCRIPT_ARGS

from ..gradio_internals import EventQueue, event_index
from ..page.handlers import api_defaults
from ..page.layout import Page, generate_concurrency
from ..page.texts import GENERATION_FAILED
from ..page.xyz_panel import plot_endpoint

logger = logging.getLogger("sdxl_jax.app")

#: Seconds an API request waits for its PNGs (written by the background pool) once the images are made.
PNG_WAIT_S = 120


class Refused(Exception):
    """A request the server turned away: an HTTP status and one sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Outcome:
    """A queued generation's end: the images' PNG paths and the seed, or how it stopped."""

    pngs: list[str]  # lossless PNGs with their `parameters` chunk, in image order
    seed: int | None  # the first image's seed (None: stopped)
    status: str  # the page's status line ("8 images in 1.2 s · ..." or "Stopped at step k / N.")

    @property
    def stopped(self) -> bool:
        return self.seed is None


@dataclass
class Running:
    """One API request in the queue: whose it is, its step, its newest preview file (A1111's /progress)."""

    caller: str
    session: str
    step: int = 0
    total: int = 0
    preview: str | None = None
    queued: bool = True


@dataclass
class QueuedGenerate:
    """Runs API requests as events of the page's queue (see the module's docstring)."""

    page: Page
    events: dict[str, int] = field(default_factory=dict)  # image format ("jpeg" + previews | "png") -> its event
    running: dict[str, Running] = field(default_factory=dict)  # by session
    interrupts: dict[str, float] = field(default_factory=dict)  # caller -> when it last asked to interrupt

    @classmethod
    def register(cls, page: Page) -> QueuedGenerate:
        """Add the two hidden events (before launch): the page's handler with previews and background PNGs (A1111:
        /progress shows the pictures forming), and its PNG variant (OpenAI, no previews)."""
        handlers = page.handlers
        queued = cls(page)
        concurrency = generate_concurrency(handlers.engine)  # the page's own limit (a group keeps its lowest)
        with page.demo:
            inputs = [gr.JSON(visible=False, label=f"api {row.name}") for row in FIELDS]
            page_own = [gr.JSON(visible=False, label="api previews"), gr.JSON(visible=False, label="api picture")]
            outputs = [gr.JSON(visible=False, label=f"api answer {i}") for i in range(3)]
            axes = [gr.JSON(visible=False, label=f"api {name}") for name in SCRIPT_ARGS[:9]]
            events = (("jpeg", handlers.endpoint(), []), ("png", handlers.endpoint("png"), []))
            for name, function, more in (*events, ("xyz", plot_endpoint(handlers), axes)):
                # No triggers (an empty list): reached only by `run`'s queue push. `triggers=None` would mean "on
                # page load and on any input's change", and every visit would queue two empty requests.
                dependency = gr.on(
                    triggers=[],
                    fn=function,
                    inputs=[*inputs, *more, *page_own],  # a plot's axes before `previews` and `picture`
                    outputs=outputs,
                    preprocess=False,
                    postprocess=False,
                    concurrency_limit=concurrency,
                    concurrency_id="generate",
                    api_visibility="private",
                    show_progress="hidden",
                )
                queued.events[name] = event_index(dependency)
        return queued

    def arguments(self, given: dict[str, Any]) -> list:
        """The handler's inputs in its order: the table's fields (given, else this server's defaults)."""
        defaults = api_defaults(self.page.handlers.rules)
        values = [given.get(row.name, defaults[row.name]) for row in FIELDS]
        axes = []  # an X/Y/Z plot's (`run`'s "xyz"): A1111's first nine script_args, None for those not given
        if "script_args" in given:
            given_axes = given["script_args"] if isinstance(given["script_args"], list) else []
            axes = [*given_axes[:9], *[None] * (9 - len(given_axes[:9]))]
        return [*values, *axes, bool(given.get("previews", False)), None]

    async def run(
        self, request, given: dict[str, Any], *, caller: str, username: str | None = None, image_format: str = "png"
    ) -> Outcome:
        """Queue one generation (`image_format` "xyz": an X/Y/Z plot, `given["script_args"]` its axes) and wait
        for its end. Raises `Refused` (busy, bad input, failure)."""
        queue = EventQueue(self.page.demo)
        session = f"api-{secrets.token_hex(12)}"
        arguments = self.arguments({**given, "previews": image_format != "png"})
        running = Running(caller, session)
        self.running[session] = running
        try:
            ok, detail, state = await queue.push(
                session=session, event=self.events[image_format], data=arguments, request=request, username=username
            )
            if not ok:
                if state == "queue_full":
                    raise Refused(503, "The server is busy: its queue is full; try again in a moment.")
                raise Refused(400, str(detail))
            return await self._follow(queue, session, running)
        except asyncio.CancelledError:  # the client went away: the request ends at its next step
            self.page.handlers.stops.stop(session)
            await queue.cancel(session)
            raise
        finally:
            self.running.pop(session, None)
            queue.forget(session)

    async def _follow(self, queue: EventQueue, session: str, running: Running) -> Outcome:
        """Read the event's messages: progress and previews into `running`, then its answer."""
        next_message = queue.messages(session)
        while True:
            message = await next_message()
            if message.kind == "progress":
                running.queued = False
                running.step, running.total = message.step, message.total
            elif message.kind == "generating" and message.success:
                gallery = (message.output.get("data") or [None])[0]
                if isinstance(gallery, list) and gallery:
                    running.preview = str(gallery[0][0])
            elif message.kind == "completed":
                if not message.success:
                    raise refusal(message.output, message.title)
                return await self._outcome(message.output.get("data") or [None, None, ""])
            elif message.kind == "failed":
                raise Refused(500, GENERATION_FAILED)

    async def _outcome(self, data: list) -> Outcome:
        """The handler's answer (gallery, seed, status) -> the PNGs (the background pool's, awaited)."""
        gallery, seed, status = data
        if not isinstance(seed, int) or not isinstance(gallery, list):
            return Outcome([], None, str(status))
        outbox = self.page.handlers.outbox
        pngs = []
        for path, _caption in gallery:
            future = outbox.png_for(path)
            if future is None:
                raise Refused(500, GENERATION_FAILED)
            pngs.append(str(await asyncio.wrap_future(future)))
        return Outcome(pngs, seed, str(status))

    def of_caller(self, caller: str) -> list[Running]:
        """The caller's requests in the queue or running, oldest first."""
        return [run for run in self.running.values() if run.caller == caller]

    def interrupted_since(self, caller: str, since: float) -> bool:
        """Whether the caller asked to interrupt after `since` (time.monotonic): a request of several engine calls
        checks it between them, where no call of it is in the queue to stop."""
        return self.interrupts.get(caller, -1.0) >= since

    def interrupt(self, caller: str) -> int:
        """Stop the caller's requests (never another caller's) at their next step; how many."""
        self.interrupts[caller] = time.monotonic()
        mine = self.of_caller(caller)
        handlers = self.page.handlers
        for run in mine:
            if not handlers.stops.stop(run.session):  # still waiting in the queue: it stops before its first step
                handlers.early_cancels.note(run.session)
        return len(mine)


def refusal(output: dict, title: str | None) -> Refused:
    """The handler's gr.Error as a status and its sentence: a refused input 4xx, a server stopping or no engine to
    run it (a page in front of engines) 503, anything else 500."""
    message = str(output.get("error") or GENERATION_FAILED)
    title = title or output.get("title") or ""
    if title == "Invalid input":
        return Refused(422, message)
    if title in ("Server stopping", "No engine"):
        return Refused(503, message)
    return Refused(500, message)
