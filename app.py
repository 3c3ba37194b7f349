"""Gradio web app: Stable Diffusion XL on JAX, one image per accelerator core.

    python app.py --model tiny                  # quick offline try with the tiny random-weight model
    python app.py                               # stabilityai/stable-diffusion-xl-base-1.0, 1024x1024, 25 steps
    python app.py --preset lightning-4step      # SDXL-Lightning's 4-step UNet: 4 trailing steps, no CFG

Every option can also come from an environment variable (the flag wins); see `python app.py --help`.
Start-up order: load the model, compile and warm it up, then open the web page, so the first visitor never waits
for a compile. The app is deliberately thin: validation lives in pipeline.validation, styles in pipeline.styles,
and everything JAX in pipeline.generator (this module never imports JAX).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextvars
import errno
import logging
import math
import os
import pathlib
import shutil
import signal
import socket
import string
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gradio as gr

from pipeline import Generator, InvalidInput, distributed
from pipeline.delivery import Outbox
from pipeline.errors import ModelLoadError
from pipeline.images import model_name, unet_name
from pipeline.loop import StopFlag, Stopped
from pipeline.options import APP, DEFAULT_QUEUE_SIZE, add_options, check_env_choices
from pipeline.presets import get_preset
from pipeline.presets import resolve as resolve_preset
from pipeline.runtime import InterruptRecord, accelerator_installed, quiet_start, use_cpu_cores
from pipeline.samplers import SAMPLER_NAMES, sampler_label
from pipeline.settings import SDXL_BASE, TINY_MODEL, shape_defaults
from pipeline.sizes import check_size, default_sizes, parse_sizes, size_label
from pipeline.styles import DEFAULT_STYLE, StyleFileError, load_examples, load_styles
from pipeline.tiny import COMPLETE_MARKER
from pipeline.validation import (
    GUIDANCE_MAX,
    GUIDANCE_MIN,
    MAX_PROMPT_CHARS,
    MAX_STEPS,
    SEED_MAX,
    PromptFilter,
    check_choice,
    check_steps,
    validate_request,
)

logger = logging.getLogger("sdxl_jax.app")

ROOT = pathlib.Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
CSS_PATH = ASSETS / "style.css"
HEADER_PATH = ASSETS / "header.md"
FOOTER_PATH = ASSETS / "footer.md"  # SDXL base 1.0: its licence
FOOTER_TINY_PATH = ASSETS / "footer-tiny.md"  # the random-weight test model
FOOTER_OTHER_PATH = ASSETS / "footer-other.md"  # any other checkpoint: its own card and licence apply
#: Logged at start-up (for whoever runs the server) when a real model runs on JAX's CPU backend.
CPU_NOTICE = (
    "⚠️ No GPU or TPU found: this runs on the CPU, where one request takes many minutes. "
    'On GPU hardware install `jax[cuda12]==0.10.2` (README, "Deploy").'
)

#: What visitors see instead: short, nothing for them to install.
CPU_VISITOR_NOTICE = "Running on a CPU: each request takes many minutes."

TITLE = "Stable Diffusion XL on JAX"
MODEL_CARD_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0"
LICENSE_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/LICENSE.md"
#: Link to the project's source shown in the header (omitted when empty); SDXL_PROJECT_URL overrides it.
PROJECT_URL = os.environ.get("SDXL_PROJECT_URL", "")
DEFAULT_GUIDANCE = 5.0
GENERATION_FAILED = "Generation failed on the server; please try again."
#: Gradio's own cache of served files (every image a user saw) lives in the app's temporary folder (removed at exit);
#: while the app runs it is swept every 5 min and files older than 15 min are removed.
DELETE_CACHE = (300, 900)
#: Runs whose files we keep on disk until Gradio has copied them into its cache: two runs are in flight and each
#: run's PNGs are fetched by a follow-up event just after its answer, so 16 leaves a wide margin.
KEEP_RUNS = 16
#: Requests in the generate event at once: one on the devices while the other does its host work (tokenizing before,
#: writing files after); the engine's device lock keeps device calls one at a time.
GENERATE_CONCURRENCY = 2
#: Seconds the page's PNG event waits for a run's background PNGs before giving up on them.
PNG_WAIT_S = 120
#: Seed of example i (fixed, so a cached example shows what its inputs really produce; "Randomize seed" is left as
#: the visitor set it, so the next prompt gets a fresh seed).
EXAMPLE_SEED_START = 1
#: What the page and the API say when the server runs the guidance-free program (--no-cfg or a few-step preset).
NO_CFG_NOTE = "this server runs without classifier-free guidance: the negative prompt and guidance scale are ignored"


# --------------------------------------------------------------------------------------------------------------
# UI


def gallery_columns(count: int) -> int:
    """Columns for `count` images: a near-2:1 grid that divides evenly (8 -> 4x2, 4 -> 2x2, 16 -> 4x4)."""
    if count <= 3:
        return max(count, 1)
    if count == 4:
        return 2
    divisors = [c for c in range(2, 9) if count % c == 0]
    if not divisors:
        return min(count, 4)
    target = math.sqrt(2 * count)
    return min(divisors, key=lambda c: (abs(c - target), c))


def _read_template(path: pathlib.Path, **values: object) -> str:
    """Fill $placeholders in a UI text file (string.Template, so braces and % in the text are left alone)."""
    return string.Template(path.read_text(encoding="utf-8")).safe_substitute({k: str(v) for k, v in values.items()})


def model_card_url(model: str) -> str:
    """The served model's card on the Hub; "" for the tiny test model and local directories (no card to link)."""
    model = model.strip()
    if model == SDXL_BASE:
        return MODEL_CARD_URL
    if is_tiny(model) or pathlib.Path(model).expanduser().exists() or model.count("/") != 1:
        return ""
    return f"https://huggingface.co/{model}"


def is_tiny(model: str) -> bool:
    """`tiny`, or a directory holding the tiny checkpoint (the file make-tiny writes last marks it)."""
    model = model.strip()
    return model == TINY_MODEL or (pathlib.Path(model).expanduser() / COMPLETE_MARKER).is_file()


def model_texts(model: str, on_cpu: bool, unet: str | None = None) -> dict[str, str]:
    """Header and footer lines that depend on the served model: only SDXL base is described as SDXL 1.0.

    Models and UNet files are named as the images' `parameters` name them (Hub id or file name, never a server path).
    """
    model = model.strip()
    if is_tiny(model):
        footer, about = FOOTER_TINY_PATH, "Model: the tiny random-weight test model (its images are noise, on purpose)"
    else:
        footer = FOOTER_PATH if model == SDXL_BASE else FOOTER_OTHER_PATH
        about = "" if model == SDXL_BASE else f"Model: `{model_name(model)}`"
    if unet:
        about = f"{about} · UNet: `{unet_name(unet)}`" if about else f"UNet: `{unet_name(unet)}`"
    notice = CPU_VISITOR_NOTICE if on_cpu and not is_tiny(model) else ""
    return {"footer_path": str(footer), "about": about, "notice": notice}


def header_links(model: str = SDXL_BASE) -> str:
    """Markdown links under the title: the model card and the project's source when PROJECT_URL is set ("" if none)."""
    card = model_card_url(model)
    links = [f"[Model card]({card})"] if card else []
    if PROJECT_URL:
        links.append(f"[Source code]({PROJECT_URL})")
    return " · ".join(links)


def sampler_summary(generator: Any) -> str:
    """e.g. "preset lightning-4step: Euler, trailing spacing, no CFG" for the log and the advanced settings."""
    sampler = getattr(generator, "sampler", None)
    if sampler is None:
        return ""
    text = f"{sampler.label}, {sampler.timestep_spacing} spacing, {'CFG' if sampler.cfg else 'no CFG'}"
    preset = getattr(generator.config, "preset", None)
    return f"preset {preset}: {text}" if preset else text


def uses_cfg(generator: Any) -> bool:
    """False when the server runs the guidance-free program (static: fixed at start-up)."""
    sampler = getattr(generator, "sampler", None)
    return sampler is None or bool(sampler.cfg)


class _ProcessFolder:
    """This process's temporary folder while a page is open: Gradio's cache of served files (`gradio/`), cached
    examples (`examples/`) and one folder per open page; removed when the last page closes.

    Gradio reads GRADIO_TEMP_DIR whenever it makes a component, not only while the page is built: an answer that
    updates an output (`gr.skip()` after a Stop, `gr.update(...)`) rebuilds that component in the session's state at
    request time, and the copy caches its files wherever the variable then points. The file route serves only the
    folder the variable named at launch, so both variables point here for as long as any page is open; pointing them
    here only while the page was built sent every later image of a stopped tab to $TMPDIR/gradio (403, left behind).

    It is made inside GRADIO_TEMP_DIR when the operator sets it, else the system's temporary directory.
    """

    _lock = threading.Lock()
    _pages = 0
    root: pathlib.Path | None = None
    _saved: dict[str, str | None] = {}

    @classmethod
    def open_page(cls) -> pathlib.Path:
        """A new page's own folder inside the process folder (made, and the variables set, for the first page)."""
        with cls._lock:
            if cls._pages == 0:
                base = os.environ.get("GRADIO_TEMP_DIR") or None
                if base:
                    pathlib.Path(base).mkdir(parents=True, exist_ok=True)
                cls.root = pathlib.Path(tempfile.mkdtemp(prefix="sdxl-jax-app-", dir=base))
                atexit.register(shutil.rmtree, cls.root, True)  # also when the process ends another way
                values = {"GRADIO_TEMP_DIR": cls.root / "gradio", "GRADIO_EXAMPLES_CACHE": cls.root / "examples"}
                cls._saved = {name: os.environ.get(name) for name in values}
                os.environ.update({name: str(value) for name, value in values.items()})
            cls._pages += 1
            return pathlib.Path(tempfile.mkdtemp(prefix="page-", dir=cls.root))

    @classmethod
    def close_page(cls, folder: pathlib.Path) -> None:
        """Remove a page's folder; with the last page, the whole process folder, and restore the variables."""
        with cls._lock:
            shutil.rmtree(folder, ignore_errors=True)
            cls._pages = max(cls._pages - 1, 0)
            if cls._pages or cls.root is None:
                return
            shutil.rmtree(cls.root, ignore_errors=True)
            cls.root = None
            for name, value in cls._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class _RunFiles:
    """One page's temporary files: per-run directories for the files handed to the gallery (and their PNGs; only the
    last KEEP_RUNS survive), inside the process folder beside Gradio's cache (see `_ProcessFolder`); removed by
    `cleanup()`, Gradio's copies with the last page."""

    def __init__(self, keep: int = KEEP_RUNS) -> None:
        self.root = _ProcessFolder.open_page()
        self.gradio_cache = pathlib.Path(os.environ["GRADIO_TEMP_DIR"])
        self._runs: collections.deque[pathlib.Path] = collections.deque()
        self._keep = keep
        self._count = 0
        self._lock = threading.Lock()
        self._closed = False

    def new_dir(self) -> pathlib.Path:
        with self._lock:
            self._count += 1
            path = self.root / f"run-{self._count:06d}"
            path.mkdir()
            self._runs.append(path)
            while len(self._runs) > self._keep:
                shutil.rmtree(self._runs.popleft(), ignore_errors=True)
            return path

    def cleanup(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _ProcessFolder.close_page(self.root)


def default_sampler(generator: Any) -> str:
    """The sampler a request gets unless it asks for another, by A1111's name (the checkpoint's or the preset's)."""
    sampler = getattr(generator, "sampler", None)
    return sampler_label(sampler.sampler) if sampler is not None else "Euler"


class _StopRequests:
    """The page's Stop button: one flag per browser session, set by Stop, read by that session's running request."""

    def __init__(self) -> None:
        self._flags: dict[str, StopFlag] = {}
        self._lock = threading.Lock()

    def begin(self, session: str) -> StopFlag:
        with self._lock:
            flag = self._flags[session] = StopFlag()
            return flag

    def end(self, session: str, flag: StopFlag) -> None:
        with self._lock:
            if self._flags.get(session) is flag:
                del self._flags[session]

    def stop(self, session: str) -> bool:
        """Stop this session's request, if one runs; True if there was one."""
        with self._lock:
            flag = self._flags.get(session)
        if flag is not None:
            flag.set()
        return flag is not None


def request_gone() -> bool:
    """True once Gradio no longer runs the calling request: cancelled (`job.cancel()`, another event's `cancels`)
    or its page closed (the queue marks its job not alive). Read from Gradio's queue, between two steps."""
    from gradio.context import LocalContext

    blocks, event_id = LocalContext.blocks.get(None), LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return False  # not run by the queue (a direct call): nothing can cancel it
    for job in list(queue.active_jobs):
        for event in job or ():
            if event._id == event_id:
                return not event.alive
    return True  # no longer among the running jobs: its task was cancelled


def offered_sizes(generator: Any) -> list[tuple[int, int]]:
    """The generator's precompiled (height, width) sizes, the default first."""
    config = generator.config
    return list(getattr(generator, "sizes", None) or [(config.height, config.width)])


def make_generate_fn(
    generator: Any,
    styles: Mapping[str, Any],
    prompt_filter: PromptFilter | None,
    files: _RunFiles,
    outbox: Outbox | None = None,
    image_format: str | None = None,
    stops: _StopRequests | None = None,
    shown: _ShownImages | None = None,
):
    """The function behind the Generate button, the examples and the /generate API endpoint.

    The answer's images are in `outbox`'s fast gallery format (JPEG), their PNGs written in the background;
    `image_format="png"` answers with the PNGs themselves (the /generate_png endpoint).
    """
    sizes = offered_sizes(generator)
    cfg = uses_cfg(generator)
    stops = stops or _StopRequests()
    default_steps = int(generator.config.steps)
    sampler_default = default_sampler(generator)
    outbox = outbox or Outbox()

    def generate(
        prompt: str,
        negative_prompt: str = "",
        style: str = DEFAULT_STYLE,
        guidance_scale: float = DEFAULT_GUIDANCE,
        seed: int = 0,
        randomize_seed: bool = True,
        aspect_ratio: str = size_label(*sizes[0]),
        steps: int = default_steps,
        sampler: str = sampler_default,
        request: gr.Request = None,  # Gradio's own injection: the caller's session (for the Stop button)
        progress: gr.Progress = gr.Progress(),  # noqa: B008  # Gradio's own injection: a live "step k / N" bar
    ) -> tuple[list[tuple[str, str]], int, str]:
        """Generate one image per accelerator core.

        Returns the images (JPEG files with `parameters` in EXIF UserComment; PNGs with a `parameters` chunk from
        /generate_png), the seed used and a status line. Stop, `job.cancel()` or a closed page end the request at
        the next denoising step.
        """
        try:
            checked = validate_request(
                prompt,
                negative_prompt,
                style,
                guidance_scale,
                seed,
                randomize_seed,
                styles=styles,
                prompt_filter=prompt_filter,
            )
            height, width = check_size(aspect_ratio, sizes)
            steps = check_steps(steps)
            sampler = check_choice(sampler, SAMPLER_NAMES, "sampler")
        except InvalidInput as exc:
            raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None

        # Step reports come from the device runtime's threads; gr.Progress finds its request through context
        # variables, so each report runs in a copy of this request's context (one at a time).
        context, context_lock = contextvars.copy_context(), threading.Lock()

        def on_step(step: int, total: int) -> None:
            with context_lock:
                context.run(progress, (step, total), desc=f"step {step} / {total}", unit="steps")

        session = getattr(request, "session_hash", None) or ""
        stop = stops.begin(session)
        started = time.perf_counter()
        try:
            result = generator.generate(
                checked.styled_prompt,
                negative_prompt=checked.styled_negative_prompt,
                seed=checked.seed,
                guidance_scale=checked.guidance_scale,
                size=(height, width),
                steps=steps,
                sampler=sampler,
                progress=on_step,
                should_stop=lambda: stop() or request_gone(),
            )
            delivery = outbox.deliver(result.images, files.new_dir(), f"sdxl-{checked.seed}", image_format)
            if shown is not None:
                shown.remember(session, delivery.gallery)
        except Stopped as stopped:
            logger.info("request %s (seed %d)", stopped, checked.seed)
            message = f"Stopped at step {stopped.done} / {stopped.total}."
            return gr.skip(), checked.seed, message  # the previous images stay
        except InvalidInput as exc:  # the engine re-checks what it is given (e.g. a styled prompt over the cap)
            raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None
        except Exception:
            logger.exception("generation failed (seed %d, style %s)", checked.seed, checked.style)
            raise gr.Error(GENERATION_FAILED, print_exception=False) from None  # logged above
        finally:
            stops.end(session, stop)
        elapsed = time.perf_counter() - started
        paths = delivery.gallery
        count = len(paths)
        engine_s = float(result.timings.get("total_s", elapsed))
        logger.info(
            "generated %d images: seed %d, style %s, guidance %g, %d steps %s, engine %.2f s, %s files %.0f ms, "
            "in all %.2f s",
            count, checked.seed, checked.style, checked.guidance_scale, steps, sampler, engine_s,
            paths[0].suffix if paths else "no", delivery.host_s * 1000, elapsed,
        )  # fmt: skip
        plural = "s" if count != 1 else ""
        steps_text = f"{result.steps} step{'s' if result.steps != 1 else ''}, {result.sampler}"
        status = f"{count} image{plural} in {engine_s:.1f} s · {width}×{height} · {steps_text} · seed {checked.seed}"
        # Only an API caller can send them; gradio_client sends the page's defaults unasked, so only say it for others.
        if not cfg and (checked.negative_prompt or checked.guidance_scale != DEFAULT_GUIDANCE):
            status += f" · {NO_CFG_NOTE}"
        if result.truncated:
            gr.Warning(result.truncated)
            status += f"\n\n⚠️ {result.truncated}"
        captions = [f"seed {s} · {width}×{height}" for s in result.seeds]
        return [(str(p), c) for p, c in zip(paths, captions, strict=True)], checked.seed, status

    return generate


class _ShownImages:
    """The gallery files each browser session was last shown, so the page's PNG follow-up needs no file input."""

    def __init__(self, keep: int = 256) -> None:
        self._names: collections.OrderedDict[str, list[str]] = collections.OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()

    def remember(self, session: str, paths: Sequence[pathlib.Path]) -> None:
        with self._lock:
            self._names[session] = [pathlib.Path(p).name for p in paths]
            self._names.move_to_end(session)
            while len(self._names) > self._keep:
                self._names.popitem(last=False)

    def names(self, session: str) -> list[str]:
        with self._lock:
            return list(self._names.get(session, []))


def make_png_fn(outbox: Outbox, shown: _ShownImages):
    """The page's follow-up to a generation: the lossless PNG (with `parameters`) of each image it just showed.

    Runs as its own event once the answer is in, so the answer never waits for PNG encoding. Images are matched by
    file name (see pipeline.delivery); no path a browser sends is ever opened.
    """

    def pngs(request: gr.Request = None) -> dict:
        names = shown.names(getattr(request, "session_hash", None) or "")
        futures = [outbox.png_for(name) for name in names]
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

    return pngs


def build_demo(
    generator: Any,
    *,
    styles: Mapping[str, Any] | None = None,
    examples: Sequence[str] | None = None,
    prompt_filter: PromptFilter | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
) -> gr.Blocks:
    """Build the page around a ready (loaded and warmed-up) generator. Launch it with `launch()`."""
    styles = load_styles() if styles is None else styles
    examples = load_examples() if examples is None else list(examples)
    config = generator.config
    count = generator.num_images
    files = _RunFiles()
    outbox = Outbox()
    unet = getattr(config, "unet", None)
    texts = model_texts(config.model, on_cpu=str(generator.device_kind).lower() == "cpu", unet=unet)
    sizes = offered_sizes(generator)
    size_labels = [size_label(h, w) for h, w in sizes]
    header = _read_template(
        HEADER_PATH,
        title=TITLE,
        device_summary=generator.device_summary,
        count=count,
        images=f"{count} image{'s' if count != 1 else ''}",
        width=config.width,
        height=config.height,
        steps=config.steps,
        model=model_name(config.model),
        more_sizes=f" (or {len(sizes) - 1} other size{'s' if len(sizes) > 2 else ''})" if len(sizes) > 1 else "",
        about=texts["about"],
        notice=texts["notice"],
        links=header_links(config.model),
    )
    footer = _read_template(
        pathlib.Path(texts["footer_path"]),
        license_url=LICENSE_URL,
        model_card_url=model_card_url(config.model) or MODEL_CARD_URL,
        model=model_name(config.model),
    )

    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=DELETE_CACHE) as demo:
        with gr.Column(elem_id="app"):
            gr.Markdown(header, elem_id="header")
            with gr.Row(elem_id="prompt-row", equal_height=True):
                prompt = gr.Textbox(
                    label="Prompt",
                    show_label=False,
                    placeholder="Describe the image you want",
                    lines=1,
                    max_lines=3,  # no max_length: a longer prompt gets a message naming the limit, not a silent cut
                    autofocus=True,
                    container=False,
                    scale=5,
                    min_width=240,
                    elem_id="prompt",
                )
                run = gr.Button("Generate", variant="primary", scale=0, min_width=130, elem_id="generate")
                stop = gr.Button("Stop", variant="stop", scale=0, min_width=90, elem_id="stop")
            gallery = gr.Gallery(
                label="Generated images",
                show_label=False,
                columns=gallery_columns(count),
                format="jpeg",  # what the page shows: fast to encode, light to send; the PNGs are below
                type="filepath",
                object_fit="contain",
                height="auto",
                preview=False,
                interactive=False,
                buttons=["download", "fullscreen"],
                elem_id="gallery",
            )
            status = gr.Markdown("", label="status", elem_id="status")  # the label names the API's third output
            png_api = gr.Button(visible=False, elem_id="generate-png")  # only the /generate_png endpoint uses it
            pngs = gr.File(
                label="Full quality: lossless PNGs with their parameters",
                file_count="multiple",
                interactive=False,
                visible=False,  # shown once a gallery's PNGs are written
                elem_id="pngs",
            )
            with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
                with gr.Row():
                    style = gr.Dropdown(
                        choices=list(styles), value=DEFAULT_STYLE, label="Style", allow_custom_value=False
                    )
                    guidance = gr.Slider(
                        minimum=GUIDANCE_MIN,
                        maximum=GUIDANCE_MAX,
                        value=DEFAULT_GUIDANCE,
                        step=0.5,
                        label="Guidance scale",
                        info=f"How closely to follow the prompt ({GUIDANCE_MIN:g} to {GUIDANCE_MAX:g}; "
                        "a number typed outside is set to the nearest limit)",
                        visible=uses_cfg(generator),  # static: the guidance-free program has no guidance
                    )
                negative = gr.Textbox(
                    value="",  # an initial value makes the API parameter optional
                    label="Negative prompt",
                    placeholder="What to keep out of the image",
                    info=f"Up to {MAX_PROMPT_CHARS:,} characters, like the prompt",
                    lines=1,
                    max_lines=3,
                    visible=uses_cfg(generator),
                )
                with gr.Row(equal_height=True):
                    seed = gr.Number(
                        label="Seed", value=0, precision=0, minimum=0, maximum=SEED_MAX, step=1, elem_id="seed"
                    )
                    randomize = gr.Checkbox(label="Randomize seed", value=True, elem_id="randomize")
                aspect = gr.Dropdown(
                    choices=size_labels,
                    value=size_labels[0],
                    label="Aspect ratio",
                    info="Width×height; every size is precompiled",
                    allow_custom_value=False,
                    elem_id="aspect",
                )
                with gr.Row(equal_height=True):
                    steps = gr.Slider(
                        minimum=1,
                        maximum=MAX_STEPS,
                        value=int(config.steps),
                        step=1,
                        label="Steps",
                        info="Denoising steps; any number runs without recompiling",
                        elem_id="steps",
                    )
                    sampler = gr.Dropdown(
                        choices=list(SAMPLER_NAMES),
                        value=default_sampler(generator),
                        label="Sampler",
                        allow_custom_value=False,
                        elem_id="sampler",
                    )
                if summary := sampler_summary(generator):  # fixed at start-up; jargon, so not in the header
                    gr.Markdown(f"Server defaults: {summary} · {config.steps} steps", elem_id="server-settings")
            stops = _StopRequests()
            shown = _ShownImages()
            generate_fn = make_generate_fn(generator, styles, prompt_filter, files, outbox, stops=stops, shown=shown)
            inputs = [prompt, negative, style, guidance, seed, randomize, aspect, steps, sampler]
            example_seeds = {text: EXAMPLE_SEED_START + i for i, text in enumerate(examples)}

            def generate_example(text, negative_text, style_name, scale, ratio, progress=gr.Progress()):  # noqa: B008
                """An example with its fixed seed (shown in the seed box); "Randomize seed" stays as it was."""
                seed_value = example_seeds.get(text, EXAMPLE_SEED_START)
                return generate_fn(  # steps and sampler: the server's defaults
                    text, negative_text, style_name, scale, seed_value, False, ratio, progress=progress
                )

            gr.Examples(
                # Each example fills the prompt and the settings; its seed is fixed, so its cached images are honest.
                examples=[[text, "", DEFAULT_STYLE, DEFAULT_GUIDANCE, size_labels[0]] for text in examples],
                example_labels=list(examples),
                inputs=[prompt, negative, style, guidance, aspect],
                outputs=[gallery, seed, status],
                fn=generate_example,
                cache_examples=True,
                cache_mode="lazy",  # computed on first click, so start-up is not slowed
                preprocess=False,  # the same raw payloads and validation as the Generate button
                label="Examples",
                elem_id="examples",
            )
            gr.Markdown(footer, elem_id="footer")

        # A new request clears the last one's status line at once (in the browser), so a refused request never
        # leaves an older request's "8 images in ..." under its error.
        gr.on(triggers=[run.click, prompt.submit], fn=None, js="() => ''", outputs=[status], api_visibility="private")
        generated = gr.on(
            triggers=[run.click, prompt.submit],
            fn=generate_fn,
            inputs=inputs,
            outputs=[gallery, seed, status],
            api_name="generate",
            api_description="One image per accelerator core; returns the images, the seed used and a status line."
            + ("" if uses_cfg(generator) else f" Note: {NO_CFG_NOTE}."),
            # Raw payloads go straight to pipeline.validation, so the API and the page get the same messages
            # (Gradio's own checks would answer out-of-range values and unknown styles in its own words).
            preprocess=False,
            concurrency_limit=GENERATE_CONCURRENCY,
            concurrency_id="generate",
            show_progress="full",
            show_progress_on=[gallery],  # one "step k / N" bar and one error badge, over the images
        )

        # The page's follow-up: the lossless PNGs of the images this session was just shown (written in the
        # background; matched by file name, so no path a browser sends is ever opened).
        generated.success(
            fn=make_png_fn(outbox, shown),
            inputs=None,
            outputs=pngs,
            api_visibility="private",  # API callers use /generate_png
            show_progress="hidden",
            concurrency_limit=4,  # it only waits on the background pool
            concurrency_id="pngs",
        )

        def stop_request(request: gr.Request) -> None:
            stops.stop(getattr(request, "session_hash", None) or "")  # the request answers "Stopped at step k / N"

        # Not queued: it must run while this session's generation holds the queue.
        stop.click(stop_request, inputs=None, outputs=None, queue=False, api_name=False)
        png_api.click(
            fn=make_generate_fn(generator, styles, prompt_filter, files, outbox, image_format="png", stops=stops),
            inputs=inputs,
            outputs=[gallery, seed, status],
            api_name="generate_png",
            api_description="The same as /generate, but the images are lossless PNGs with a `parameters` text chunk "
            "(slower to encode and about 8x larger than /generate's JPEGs).",
            preprocess=False,
            concurrency_limit=GENERATE_CONCURRENCY,  # a group takes its events' lowest limit: give the same
            concurrency_id="generate",  # shares /generate's slots
        )
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    demo.sdxl_files = files  # type: ignore[attr-defined]  # cleaned up by close_demo()
    demo.sdxl_outbox = outbox  # type: ignore[attr-defined]  # its PNG pool is stopped by close_demo()
    return demo


def theme() -> gr.themes.Base:
    """Gradio's default theme with a violet accent; fonts are served by Gradio itself (works offline)."""
    return gr.themes.Default(primary_hue="violet", secondary_hue="slate", radius_size="lg")


def launch(
    demo: gr.Blocks,
    *,
    host: str = "127.0.0.1",
    port: int = 7860,
    share: bool = False,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    auth: Sequence[tuple[str, str]] | None = None,
) -> gr.Blocks:
    """Start serving `demo` (Gradio 6 takes the theme and CSS at launch time); `auth`: Gradio's login, if given."""
    demo.launch(
        auth=list(auth) if auth else None,
        auth_message=f"<h2>{TITLE}</h2><p>Sign in to generate images.</p>" if auth else None,
        server_name=host,
        server_port=port,
        share=share,
        prevent_thread_lock=prevent_thread_lock,
        quiet=quiet,
        show_error=True,
        theme=theme(),
        css_paths=[CSS_PATH],
        ssr_mode=False,
    )
    return demo


def close_demo(demo: gr.Blocks) -> None:
    """Stop the server, its background PNG writers, and remove this app's temporary files."""
    demo.close()
    outbox = getattr(demo, "sdxl_outbox", None)
    if outbox is not None:
        outbox.close()
    files = getattr(demo, "sdxl_files", None)
    if files is not None:
        files.cleanup()


# --------------------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The app's options (pipeline/options.py's table), checked, with the preset's and the model's defaults filled."""
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="Serve Stable Diffusion XL with JAX in a Gradio web app. "
        "Each option can also be set by the environment variable in brackets; the flag wins.",
    )
    add_options(parser, APP)
    args = parser.parse_args(argv)
    check_env_choices(parser, args, APP)
    try:
        args.auth = read_auth(args.auth or [os.environ.get("SDXL_AUTH")], args.auth_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.sizes and (args.height is not None or args.width is not None):
        parser.error(
            "--sizes and --height/--width do not go together (SDXL_SIZES, SDXL_HEIGHT, SDXL_WIDTH too): --sizes "
            "lists every offered size, the first the default; --height/--width alone offer that one size"
        )
    one_size = args.height is not None or args.width is not None
    args.cfg = False if args.no_cfg else None
    if args.preset:  # the preset's settings where no flag gave one
        names = ("height", "width", "steps", "sampler", "timestep_spacing", "cfg", "unet", "variant")
        try:
            settings = resolve_preset(get_preset(args.preset), model=args.model, **{k: getattr(args, k) for k in names})
        except InvalidInput as exc:
            parser.error(str(exc))
        settings.pop("guidance_scale")  # the slider's default stays; the guidance-free program hides it
        for key, value in settings.items():
            setattr(args, key, value)
        preset_size = (settings.get("height"), settings.get("width"))  # absent on another model (e.g. tiny)
        one_size = one_size or (None not in preset_size and preset_size != shape_defaults(args.model)[:2])
    args.model = args.model or SDXL_BASE
    args.cfg = args.cfg is not False
    if args.sizes:
        try:
            args.sizes = parse_sizes(args.sizes, tiny=args.model.strip() == TINY_MODEL)
        except InvalidInput as exc:
            parser.error(str(exc))
    elif not one_size:
        args.sizes = default_sizes(tiny=args.model.strip() == TINY_MODEL)
    for key, value in zip(("height", "width", "steps"), shape_defaults(args.model), strict=True):
        if getattr(args, key) is None:  # one set of defaults per model, shared with the CLI (pipeline.settings)
            setattr(args, key, value)
    return args


def read_auth(pairs: Sequence[object], path: str | None = None) -> list[tuple[str, str]]:
    """USER:PASSWORD pairs from flags/env and from a file (one a line, '#' comments) for Gradio's own login."""
    lines = [str(p) for p in pairs if p]
    if path:
        text = pathlib.Path(path).read_text(encoding="utf-8-sig")
        lines += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    logins = []
    for number, line in enumerate(lines, 1):
        user, sep, password = line.partition(":")
        if not (sep and user.strip() and password):
            where = f"{path}, login {number}" if path else f"login {number}"
            raise ValueError(f"{where}: expected USER:PASSWORD with both parts non-empty")  # never echo a password
        logins.append((user.strip(), password))
    return logins


#: Sampler settings a parsed command line passes to the engine (None = the checkpoint's own).
SAMPLER_ARGS = ("sampler", "timestep_spacing", "steps_offset", "prediction_type", "cfg", "preset")


def load_generator(args: argparse.Namespace) -> Generator:
    """Load, compile and warm up, logging each phase with its time."""
    shape = {k: getattr(args, k) for k in ("height", "width", "steps") if getattr(args, k) is not None}
    sizes = getattr(args, "sizes", None)
    if sizes:  # the first offered size is the default one
        shape["height"], shape["width"] = sizes[0]
    logger.info("loading %s: %d×%d, %d steps", args.model, shape["width"], shape["height"], shape["steps"])
    real_model = not is_tiny(args.model)
    if real_model and not accelerator_installed():  # say it before a download and a compile that take very long
        logger.warning(CPU_NOTICE.replace("`", ""))
    started = time.perf_counter()
    generator = Generator.from_pretrained(
        args.model,
        dtype=args.dtype,
        per_device_batch=args.per_device_batch,
        attention=args.attention,
        compilation_cache=not getattr(args, "no_compilation_cache", False),
        variant=args.variant,
        unet=args.unet,
        sizes=sizes or None,
        progress=not getattr(args, "no_progress", False),
        **shape,
        **{k: getattr(args, k) for k in SAMPLER_ARGS if getattr(args, k, None) is not None},
    )
    timings = dict(getattr(generator, "load_timings", {}) or {})
    for phase in ("load", "cast", "replicate"):
        if f"{phase}_s" in timings:
            logger.info("%-9s %7.2f s", phase, timings[f"{phase}_s"])
    config = generator.config
    logger.info(
        "ready to compile: %s, %d×%d, %d steps, %s, %s attention, %d images per request",
        generator.device_summary, config.width, config.height, config.steps, config.dtype,
        config.attention, generator.num_images,
    )  # fmt: skip
    if real_model and accelerator_installed() and str(generator.device_kind).lower() == "cpu":
        logger.warning(CPU_NOTICE.replace("`", ""))  # a GPU/TPU plugin is installed but found no device
    if sizes:
        logger.info("sizes: %s", ", ".join(size_label(h, w) for h, w in sizes))
    logger.info("sampler: %s", sampler_summary(generator))
    if getattr(args, "precompiled", None):  # one line: which programs were loaded, which are compiled and why
        from pipeline.aot import load_precompiled

        load_precompiled(generator.programs, generator.program_keys(), args.precompiled)
    warm = generator.warmup() or {}
    logger.info("%-9s %7.2f s", "compile", warm.get("compile_s", float("nan")))
    logger.info("%-9s %7.2f s", "first run", warm.get("first_run_s", float("nan")))
    logger.info("engine ready in %.1f s", time.perf_counter() - started)
    return generator


def port_problem(host: str, port: int) -> str | None:
    """Why the page could not be served on host:port (in use, or no such interface), checked before minutes of
    loading and compiling; None when it is free. Binds the way uvicorn does (SO_REUSEADDR), then lets go."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: not an address of this machine ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use (another server?); pass --port with a free one"
            return f"cannot listen on {host}:{port} ({exc.strerror}); pass another --host or --port"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up checks
    logging.getLogger("jax").setLevel(logging.WARNING)  # backend probing ("Unable to initialize backend 'tpu'")
    args = parse_args(argv)
    serves = args.process_id in (None, 0)  # process 0 (or the only one) serves the page; the others follow
    if serves and (problem := port_problem(args.host, args.port)):
        print(f"app.py: error: {problem}", file=sys.stderr)
        return 2
    try:
        with InterruptRecord() as interrupt:
            outcome = _start(args)
    except KeyboardInterrupt:  # Ctrl-C while loading or compiling: one line, not the libraries' traceback
        print("app.py: stopped during start-up", file=sys.stderr, flush=True)
        return 130
    if isinstance(outcome, int):
        return outcome
    demo, cluster, started = outcome
    try:
        if interrupt.interrupted:  # Ctrl-C that a library swallowed: stop now rather than serve
            print("app.py: stopped during start-up", file=sys.stderr, flush=True)
            return 130
        return _serve(args, demo, started)
    finally:
        close_demo(demo)
        cluster.stop()  # STOP to the followers (a no-op on one process)


def _serve(args: argparse.Namespace, demo: gr.Blocks, started: float) -> int:
    """Open the page and serve until SIGTERM or Ctrl-C; the caller closes it. The exit status."""
    stop = threading.Event()

    def request_stop(signum, _frame):
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        launch(
            demo, host=args.host, port=args.port, share=args.share, prevent_thread_lock=True, quiet=True,
            auth=args.auth,
        )  # fmt: skip
    except OSError as exc:  # the port was taken while the model loaded
        print(f"app.py: error: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    if args.auth:
        logger.info("login required: %d user(s)", len(args.auth))
    logger.info("web UI up in %.2f s", time.perf_counter() - started)
    print(f"Running on {demo.local_url}", flush=True)
    if demo.share_url:
        print(f"Public link: {demo.share_url}", flush=True)
    while not stop.wait(1.0):
        pass
    logger.info("stopped")
    return 0


def _start(args: argparse.Namespace):
    """Everything before the page opens: load, compile, warm up, build the page. An exit status on failure (or on a
    follower, when it is done), else (demo, cluster, started)."""
    use_cpu_cores(args.cpu_devices)  # before anything imports JAX; app.py itself never does
    quiet_start()
    try:
        prompt_filter = PromptFilter.from_file(args.prompt_filter) if args.prompt_filter else None
        styles = load_styles()
        examples = load_examples()
    except (OSError, StyleFileError) as exc:
        print(f"app.py: error: {exc}", file=sys.stderr)
        return 2
    if prompt_filter is not None:
        logger.info("prompt filter: %d blocked words or phrases from %s", len(prompt_filter), args.prompt_filter)
    try:
        cluster = distributed.start(distributed.options_from_args(args))  # before anything else touches JAX
        generator = load_generator(args)
    except (ModelLoadError, InvalidInput) as exc:
        print(f"app.py: error: {exc}", file=sys.stderr)
        return 2
    if not cluster.is_leader:
        return cluster.follow(generator)  # runs what process 0 is asked, until process 0 stops
    generator = cluster.lead(generator)
    started = time.perf_counter()
    demo = build_demo(
        generator, styles=styles, examples=examples, prompt_filter=prompt_filter, queue_size=args.queue_size
    )
    return demo, cluster, started


if __name__ == "__main__":
    sys.exit(main())
