"""The page's "X/Y/Z plot" section and the function behind it (the page's "Run plot" and A1111's API's
`script_name: "x/y/z plot"`): the form's request with up to three axes, each cell run as the ordinary request it is
(pipeline/contract/xyz_run.py), answered with the grids then each cell's image.

The plot is one event of the page's "generate" queue: one slot, Stop ends it (the cells that finished stay: the
grid shows them), progress counts every cell's steps, and the history keeps the plot as one entry (its grids
first). The plot's axes arrive as A1111 1.10's `script_args` (`xyz_plot.SCRIPT_ARGS`), the page's and the API's alike.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import gradio as gr

from pipeline.contract.errors import InvalidInput
from pipeline.contract.parameters import model_name, status_size
from pipeline.contract.xyz_plot import AXES, SCRIPT_ARGS, Cell, Plot
from pipeline.contract.xyz_run import PlotOutcome, run_plot

from .handlers import FIELD_DOC_LINES, EngineRun, Finished, Handlers, api_signature, invalid
from .sessions import session_of
from .texts import GENERATION_FAILED

logger = logging.getLogger("sdxl_jax.app")

#: The page's axis choices: A1111's labels of the axes this server plots ("Nothing": the axis left out).
AXIS_CHOICES = tuple(AXES)

#: /xyz_plot's docstring (gradio_client's view_api, MCP's tool): the plot, then /generate's request fields and the axes.
PLOT_DOC = "\n".join(
    [
        "An X/Y/Z plot (A1111's script): the request with up to three axes, each cell one ordinary request with its "
        "values (nothing compiles).",
        "",
        "Returns the grids (one per Z value, labelled; X across, Y down) then each cell's first image (JPEG files "
        "with `parameters` in EXIF UserComment, a grid's with the plot's axes added), the first cell's seed and a "
        "status line. Stop or `job.cancel()` end it at the next step: the cells that finished are answered.",
        "",
        "Parameters:",
        *FIELD_DOC_LINES,
        *(
            line
            for letter, where in (("x", "across"), ("y", "down"), ("z", "one grid per value"))
            for line in (
                f"    {letter}_type: the {letter.upper()} axis ({where}): A1111's label "
                f"({', '.join(AXIS_CHOICES[1:])}) or its index in A1111 1.10's txt2img list; Nothing leaves it out",
                f"    {letter}_values: its values as A1111 writes them: '4, 6', ranges '1-5 (+2)' and '1-3 [3]'",
                f"    {letter}_values_dropdown: its values as a list (A1111's dropdown), read when {letter}_values is "
                "empty",
            )
        ),
    ]
)


@dataclass(frozen=True)
class PlotResult:
    """A finished plot as the history and the status line read a result (`EngineResult`'s fields): the grids,
    then each finished cell's first image."""

    images: list
    seeds: list[int]
    prompt: str
    negative_prompt: str
    parameters: list[str]
    steps: int
    sampler: str
    truncated: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, outcome: PlotOutcome, seconds: float) -> PlotResult:
        first = next(result for result in outcome.results if result is not None)
        images = [*outcome.grids, *outcome.cell_images]
        return cls(
            images=images,
            seeds=[int(outcome.cells[0].request.seed)] * len(images),
            prompt=first.prompt,
            negative_prompt=first.negative_prompt,
            parameters=[str(image.info.get("parameters", "")) for image in images],
            steps=first.steps,
            sampler=first.sampler,
            timings={"total_s": seconds},
        )


def xyz_section() -> tuple[list, gr.Button]:
    """The "X/Y/Z plot" accordion: per axis its type (A1111's labels) and values, and "Run plot". Returns the
    inputs in A1111's `script_args` order (type, values, dropdown per axis) and the button."""
    inputs: list = []
    with gr.Accordion("X/Y/Z plot", open=False, elem_id="xyz-plot"):
        gr.Markdown(
            "Each cell is one request with the form's settings and its values: `4, 6`, ranges `1-5 (+2)` and "
            "`1-3 [3]` as A1111 writes them. The grid, then each cell's image.",
            elem_id="xyz-help",
        )
        for letter, default in (("x", "Steps"), ("y", "Nothing"), ("z", "Nothing")):
            with gr.Row(equal_height=True):
                kind = gr.Dropdown(
                    list(AXIS_CHOICES), value=default, label=f"{letter.upper()} type", elem_id=f"xyz-{letter}-type"
                )
                values = gr.Textbox(label=f"{letter.upper()} values", elem_id=f"xyz-{letter}-values", scale=3)
            inputs += [kind, values, gr.JSON(value=[], visible=False, label=f"{letter} values dropdown")]
        run = gr.Button("Run plot", variant="secondary", elem_id="xyz-run")
    return inputs, run


def plot_endpoint(handlers: Handlers, labels: Mapping[str, str] | None = None, *, streams: bool = True):
    """The function of the page's "Run plot", gradio_client's /xyz_plot and A1111's plot event: the API's request
    fields, the plot's axes as A1111's first nine script_args (type, values, dropdown per axis), then `previews` and
    `picture`; yields progress, then (gallery, seed, status). `labels`: the page's (`Handlers.endpoint`).
    `streams=False`: a plain function that returns the answer (gradio_client fetches a stream's last message's files
    twice)."""
    base = list(api_signature(handlers.rules).parameters.values())
    keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD
    axes = [inspect.Parameter(name, keyword, default=None) for name in SCRIPT_ARGS[:9]]
    # The axes after the request fields, then `previews`, `picture` (left at their defaults but by A1111's queue
    # call: a plot streams no previews, starts from no strokes), Gradio's request and progress.
    signature = inspect.Signature([*base[:-4], *axes, *base[-4:]])
    model = model_name(handlers.engine.config.model)

    def run_xyz_plot(*args, **kwargs) -> Iterator[tuple]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given, request = dict(bound.arguments), bound.arguments["request"]
        try:
            plot = Plot.of_script_args([given[name] for name in SCRIPT_ARGS[:9]], most=handlers.xyz_max_cells)
            cells = plot.cells(given, handlers.request_of, model=model)
        except InvalidInput as exc:
            raise invalid(exc, labels) from None
        user = getattr(request, "username", None)
        yield from _run(handlers, plot, cells, session_of(request), given["progress"], user)

    def xyz_plot_answer(*args, **kwargs) -> tuple:
        return list(run_xyz_plot(*args, **kwargs))[-1]

    function = run_xyz_plot if streams else xyz_plot_answer
    function.__signature__ = signature
    function.__annotations__ = {name: parameter.annotation for name, parameter in signature.parameters.items()}
    function.__doc__ = PLOT_DOC
    return function


def _run(handlers: Handlers, plot: Plot, cells: list[Cell], session: str, progress, user: str | None):
    """The plot's cells on the engine in a worker thread (Stop, a cancel, the server stopping end it), its progress
    reported as every cell's steps, then its answer."""
    stop = handlers.stops.begin(session)
    started = time.perf_counter()
    context, lock = contextvars.copy_context(), threading.Lock()

    def on_progress(done: int, total: int, finished: int, count: int) -> None:
        with lock:
            text = f"cell {min(finished + 1, count)} / {count} · step {done} / {total}"
            context.run(progress, (done, total), desc=text, unit="steps")

    worker = EngineRun(
        lambda: run_plot(
            handlers.engine,
            plot,
            cells,
            on_progress=on_progress if handlers.progress else None,
            should_stop=lambda: stop() or handlers.shutting_down.is_set(),
        ),
        contextvars.copy_context(),
    )
    try:
        outcome = worker.result()
    except Exception:
        logger.exception("the X/Y/Z plot failed (%d cells)", len(cells))
        raise gr.Error(GENERATION_FAILED, print_exception=False) from None
    finally:
        worker.join()
        handlers.stops.end(session, stop)
    if not outcome.finished:
        yield gr.skip(), gr.skip(), f"Stopped: none of the plot's {len(cells)} cells finished."
        return
    yield _answer(handlers, outcome, session, user, time.perf_counter() - started)


def _answer(handlers: Handlers, outcome: PlotOutcome, session: str, user: str | None, seconds: float) -> tuple:
    """The plot's files (the grids, then each finished cell's image), the history told, the status line."""
    result = PlotResult.of(outcome, seconds)
    first = outcome.cells[0].request
    delivery = handlers.outbox.deliver(result.images, handlers.files.new_dir(), f"xyz-{first.seed}")
    grids = len(outcome.grids)
    captions = [f"grid {i + 1} / {grids}" if i < grids else "" for i in range(len(result.images))]
    cell_names = [cell.where for cell, done in zip(outcome.cells, outcome.results, strict=True) if done is not None]
    captions[grids:] = cell_names
    gallery = [(str(path), caption) for path, caption in zip(delivery.gallery, captions, strict=True)]
    handlers.shown.remember(session, delivery.gallery, gallery)
    if handlers.on_finished is not None:
        handlers.on_finished(Finished(first, result, delivery, session, user))
    count, size = len(outcome.cells), status_size(first.size)
    status = f"X/Y/Z plot: {outcome.finished} of {count} cells in {seconds:.1f} s · {size} · seed {first.seed}"
    if outcome.stopped is not None:
        status += " · stopped: the cells that finished are shown"
    return gallery, first.seed, status
