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
import collections
import contextlib
import contextvars
import logging
import math
import os
import pathlib
import shutil
import signal
import string
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import gradio as gr

from pipeline import Generator, InvalidInput, distributed
from pipeline.loading import ModelLoadError
from pipeline.loop import StopFlag, Stopped
from pipeline.presets import PRESET_NAMES, get_preset
from pipeline.presets import resolve as resolve_preset
from pipeline.runtime import accelerator_installed, quiet_start, use_cpu_cores
from pipeline.samplers import PREDICTION_TYPES, SAMPLER_NAMES, SPACINGS, sampler_id, sampler_label
from pipeline.settings import ATTENTIONS, SDXL_BASE, TINY_MODEL, shape_defaults
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
#: Said at start-up and on the page when a real model runs on JAX's CPU backend (e.g. a GPU Space with CPU JAX).
CPU_NOTICE = (
    "⚠️ No GPU or TPU found: this runs on the CPU, where one request takes many minutes. "
    'On GPU hardware install `jax[cuda12]==0.10.2` (README, "Deploy as a Hugging Face Space").'
)

TITLE = "Stable Diffusion XL on JAX"
MODEL_CARD_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0"
LICENSE_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/LICENSE.md"
#: Link to the project's source shown in the header (omitted when empty); SDXL_PROJECT_URL overrides it.
PROJECT_URL = os.environ.get("SDXL_PROJECT_URL", "")
JAX_URL = "https://github.com/jax-ml/jax"
DEFAULT_GUIDANCE = 5.0
DEFAULT_QUEUE_SIZE = 20
GENERATION_FAILED = "Generation failed on the server; please try again."
#: Gradio's own cache of served files (every image a user saw): swept every 5 min, files older than 15 min removed.
DELETE_CACHE = (300, 900)
#: Runs whose PNGs we keep on disk until Gradio has copied them into its cache (only one run is in flight).
KEEP_RUNS = 4
#: Seed of example i (fixed, with randomize off, so a cached example shows what its inputs really produce).
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


def model_texts(model: str, on_cpu: bool) -> dict[str, str]:
    """Header and footer lines that depend on the served model: only SDXL base is described as SDXL 1.0."""
    model = model.strip()
    if is_tiny(model):
        footer, about = FOOTER_TINY_PATH, "Model: the tiny random-weight test model (its images are noise, on purpose)"
    else:
        footer, about = (FOOTER_PATH, "") if model == SDXL_BASE else (FOOTER_OTHER_PATH, f"Model: `{model}`")
    notice = CPU_NOTICE if on_cpu and not is_tiny(model) else ""
    return {"footer_path": str(footer), "about": about, "notice": notice}


def header_links(model: str = SDXL_BASE) -> str:
    """Markdown links under the title: model card, JAX, and the project's source when PROJECT_URL is set."""
    card = model_card_url(model)
    links = ([f"[Model card]({card})"] if card else []) + [f"[JAX]({JAX_URL})"]
    if PROJECT_URL:
        links.append(f"[Source code]({PROJECT_URL})")
    return " · ".join(links)


def sampler_summary(generator: Any) -> str:
    """e.g. "preset lightning-4step: Euler, trailing spacing, no CFG" for the header."""
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


class _RunFiles:
    """Per-run directories for the PNGs handed to the gallery; only the last KEEP_RUNS survive."""

    def __init__(self, keep: int = KEEP_RUNS) -> None:
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sdxl-jax-app-"))
        self._runs: collections.deque[pathlib.Path] = collections.deque()
        self._keep = keep
        self._count = 0
        self._lock = threading.Lock()

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
        shutil.rmtree(self.root, ignore_errors=True)


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
    stops: _StopRequests | None = None,
):
    """The function behind the Generate button, the examples and the /generate API endpoint."""
    sizes = offered_sizes(generator)
    cfg = uses_cfg(generator)
    stops = stops or _StopRequests()
    default_steps = int(generator.config.steps)
    sampler_default = default_sampler(generator)

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

        Returns the images (PNG files carrying a `parameters` text chunk), the seed used and a status line.
        Stop, `job.cancel()` or a closed page end the request at the next denoising step.
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
            paths = result.save_pngs(files.new_dir(), stem=f"sdxl-{checked.seed}")
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
        count = len(paths)
        engine_s = float(result.timings.get("total_s", elapsed))
        logger.info(
            "generated %d images: seed %d, style %s, guidance %g, %d steps %s, engine %.2f s, with PNGs %.2f s",
            count, checked.seed, checked.style, checked.guidance_scale, steps, sampler, engine_s, elapsed,
        )  # fmt: skip
        plural = "s" if count != 1 else ""
        steps_text = f"{result.steps} step{'s' if result.steps != 1 else ''}, {result.sampler}"
        status = f"{count} image{plural} in {engine_s:.1f} s · {width}×{height} · {steps_text} · seed {checked.seed}"
        if not cfg and (checked.negative_prompt or checked.guidance_scale > 1):  # only an API caller can send them
            status += f" · {NO_CFG_NOTE}"
        if result.truncated:
            gr.Warning(result.truncated)
            status += f"\n\n⚠️ {result.truncated}"
        captions = [f"seed {s} · {width}×{height}" for s in result.seeds]
        return [(str(p), c) for p, c in zip(paths, captions, strict=True)], checked.seed, status

    return generate


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
    texts = model_texts(config.model, on_cpu=str(generator.device_kind).lower() == "cpu")
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
        model=config.model,
        sampler=f" · {summary}" if (summary := sampler_summary(generator)) else "",
        more_sizes=f" (or {len(sizes) - 1} other aspect ratio{'s' if len(sizes) > 2 else ''})"
        if len(sizes) > 1
        else "",
        about=texts["about"],
        notice=texts["notice"],
        links=header_links(config.model),
    )
    footer = _read_template(
        pathlib.Path(texts["footer_path"]),
        license_url=LICENSE_URL,
        model_card_url=model_card_url(config.model) or MODEL_CARD_URL,
        model=config.model,
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
                format="png",
                object_fit="contain",
                height="auto",
                preview=False,
                interactive=False,
                buttons=["download", "fullscreen"],
                elem_id="gallery",
            )
            status = gr.Markdown("", label="status", elem_id="status")  # the label names the API's third output
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
            stops = _StopRequests()
            generate_fn = make_generate_fn(generator, styles, prompt_filter, files, stops)
            inputs = [prompt, negative, style, guidance, seed, randomize, aspect, steps, sampler]
            with _examples_cache(files.root / "examples"):
                gr.Examples(
                    # Each example fills every input (fixed seed, randomize off): its cached images are honest.
                    examples=[
                        [
                            text, "", DEFAULT_STYLE, DEFAULT_GUIDANCE, EXAMPLE_SEED_START + i, False, size_labels[0],
                            int(config.steps), default_sampler(generator),
                        ]
                        for i, text in enumerate(examples)
                    ],  # fmt: skip
                    example_labels=list(examples),
                    inputs=inputs,
                    outputs=[gallery, seed, status],
                    fn=generate_fn,
                    cache_examples=True,
                    cache_mode="lazy",  # computed on first click, so start-up is not slowed
                    preprocess=False,  # the same raw payloads and validation as the Generate button
                    label="Examples",
                    elem_id="examples",
                )
            gr.Markdown(footer, elem_id="footer")

        gr.on(
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
            concurrency_limit=1,
            concurrency_id="generate",
            show_progress="full",
            show_progress_on=[gallery],  # one "step k / N" bar and one error badge, over the images
        )

        def stop_request(request: gr.Request) -> None:
            stops.stop(getattr(request, "session_hash", None) or "")  # the request answers "Stopped at step k / N"

        # Not queued: it must run while this session's generation holds the queue.
        stop.click(stop_request, inputs=None, outputs=None, queue=False, api_name=False)
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    demo.sdxl_files = files  # type: ignore[attr-defined]  # cleaned up by close_demo()
    return demo


@contextlib.contextmanager
def _examples_cache(directory: pathlib.Path):
    """Keep this app's cached examples in its own temporary folder (Gradio reads GRADIO_EXAMPLES_CACHE when building
    gr.Examples), so a restart with another model or size never shows images cached by a previous one."""
    previous = os.environ.get("GRADIO_EXAMPLES_CACHE")
    os.environ["GRADIO_EXAMPLES_CACHE"] = str(directory)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("GRADIO_EXAMPLES_CACHE", None)
        else:
            os.environ["GRADIO_EXAMPLES_CACHE"] = previous


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
    """Stop the server and remove this app's temporary PNGs."""
    demo.close()
    files = getattr(demo, "sdxl_files", None)
    if files is not None:
        files.cleanup()


# --------------------------------------------------------------------------------------------------------------
# Command line


def _env(name: str, default: object = None) -> object:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="app.py",
        description="Serve Stable Diffusion XL with JAX in a Gradio web app. "
        "Each option can also be set by the environment variable in brackets; the flag wins.",
    )
    add = parser.add_argument
    add(
        "--model",
        default=_env("SDXL_MODEL"),
        help=f"Hub id, local diffusers directory (Flax or PyTorch safetensors), or 'tiny' [SDXL_MODEL; {SDXL_BASE}]",
    )
    add("--variant", default=_env("SDXL_VARIANT"), help="PyTorch weight variant, e.g. fp16 [SDXL_VARIANT]")
    add("--unet", default=_env("SDXL_UNET"), help="whole-UNet .safetensors, PATH or REPO:FILE [SDXL_UNET]")
    add(
        "--host",
        default=_env("GRADIO_SERVER_NAME", "127.0.0.1"),
        help="interface to bind; 0.0.0.0 to accept remote connections [GRADIO_SERVER_NAME; default 127.0.0.1]",
    )
    add("--port", type=int, default=_env("GRADIO_SERVER_PORT", 7860), help="port [GRADIO_SERVER_PORT; default 7860]")
    add(
        "--height",
        type=int,
        default=_env("SDXL_HEIGHT"),
        help="image height in pixels, multiple of 32 [SDXL_HEIGHT; default 1024, 128 for tiny]",
    )
    add(
        "--width",
        type=int,
        default=_env("SDXL_WIDTH"),
        help="image width in pixels, multiple of 32 [SDXL_WIDTH; default 1024, 128 for tiny]",
    )
    add("--steps", type=int, default=_env("SDXL_STEPS"), help="denoising steps [SDXL_STEPS; default 25, 4 for tiny]")
    add(
        "--sizes",
        metavar="WxH,WxH,...",
        default=_env("SDXL_SIZES"),
        help="offered sizes, each compiled at start-up, the first the default; 'sdxl' = SDXL's 9 trained sizes "
        "[SDXL_SIZES; default 1024x1024,1344x768,768x1344, the same ratios at ~128 px for tiny; --height/--width "
        "alone: that one size]",
    )
    add(
        "--no-progress",
        action="store_true",
        default=str(_env("SDXL_NO_PROGRESS", "")).lower() in ("1", "true", "yes"),
        help="no live step progress: the compiled program has no per-step host callback [SDXL_NO_PROGRESS]",
    )
    add(
        "--dtype",
        choices=["bfloat16", "float32"],
        default=_env("SDXL_DTYPE"),
        help="network dtype [SDXL_DTYPE; default bfloat16 on TPU/GPU, float32 on CPU]",
    )
    add(
        "--attention",
        choices=ATTENTIONS,
        default=_env("SDXL_ATTENTION", "auto"),
        help="UNet attention core: auto = splash on TPU, cudnn on NVIDIA (bf16), xla elsewhere [SDXL_ATTENTION; auto]",
    )
    add(
        "--queue-size",
        type=int,
        default=_env("SDXL_QUEUE_SIZE", DEFAULT_QUEUE_SIZE),
        help=f"requests that may wait; more are turned away as busy [SDXL_QUEUE_SIZE; default {DEFAULT_QUEUE_SIZE}]",
    )
    add(
        "--per-device-batch",
        type=int,
        default=_env("SDXL_PER_DEVICE_BATCH", 1),
        help="images per device per request [SDXL_PER_DEVICE_BATCH; default 1]",
    )
    add(
        "--prompt-filter",
        metavar="FILE",
        default=_env("SDXL_PROMPT_FILTER"),
        help="block list, one word or phrase a line (see assets/blocked_words.example.txt) [SDXL_PROMPT_FILTER]",
    )
    add(
        "--preset",
        choices=PRESET_NAMES,
        default=_env("SDXL_PRESET"),
        help="few-step recipe (assets/presets.json): model, UNet file, steps, sampler, spacing, guidance, size; "
        "flags override it; with --model tiny only its sampler settings [SDXL_PRESET]",
    )
    add(
        "--sampler",
        type=sampler_argument,
        default=_env("SDXL_SAMPLER"),
        help=f"a request's default sampler: {', '.join(SAMPLER_NAMES)} (requests may pick another); "
        "default: the checkpoint's [SDXL_SAMPLER]",
    )
    add(
        "--timestep-spacing",
        choices=SPACINGS,
        default=_env("SDXL_TIMESTEP_SPACING"),
        help="default: the checkpoint's [SDXL_TIMESTEP_SPACING]",
    )
    add("--steps-offset", type=int, default=_env("SDXL_STEPS_OFFSET"), help="default: the checkpoint's")
    add("--prediction-type", choices=PREDICTION_TYPES, default=_env("SDXL_PREDICTION_TYPE"), help="default: checkpoint")
    add(
        "--no-cfg",
        action="store_true",
        default=str(_env("SDXL_NO_CFG", "")).lower() in ("1", "true", "yes"),
        help="guidance-free program: the UNet runs on the prompt only; guidance, negative prompt hidden [SDXL_NO_CFG]",
    )
    add("--share", action="store_true", help="also open a public *.gradio.live link (needs internet)")  # fmt: skip
    add(
        "--auth",
        action="append",
        metavar="USER:PASSWORD",
        default=[],
        help="require this login (repeat for more users) [SDXL_AUTH: one USER:PASSWORD]",
    )
    add(
        "--auth-file",
        metavar="FILE",
        default=_env("SDXL_AUTH_FILE"),
        help="require a login from this file, one USER:PASSWORD a line [SDXL_AUTH_FILE]",
    )
    add(
        "--cpu-devices",
        type=int,
        default=_env("SDXL_CPU_DEVICES"),
        help="CPU only: JAX devices to split the CPU into, one image each per request; 0 = one device "
        "[SDXL_CPU_DEVICES; default one per core]",
    )
    add(
        "--precompiled",
        metavar="DIR",
        default=_env("SDXL_PRECOMPILED"),
        help="load the matching executables written by `python -m pipeline precompile` from DIR; compile the rest "
        "[SDXL_PRECOMPILED]",
    )
    distributed.add_arguments(parser)  # multi-host: the same command on every host; process 0 serves the page
    args = parser.parse_args(argv)
    try:
        args.auth = read_auth(args.auth or [_env("SDXL_AUTH")], args.auth_file)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
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


def sampler_argument(value: str) -> str:
    """argparse type of --sampler: A1111's names (any case) or the engine's ids, kept as A1111's name."""
    try:
        return sampler_label(sampler_id(value))
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    logger.info("loading %s %s", args.model, " ".join(f"{k}={v}" for k, v in shape.items()))
    real_model = not is_tiny(args.model)
    if real_model and not accelerator_installed():  # say it before a download and a compile that take very long
        logger.warning(CPU_NOTICE.replace("`", ""))
    started = time.perf_counter()
    generator = Generator.from_pretrained(
        args.model,
        dtype=args.dtype,
        per_device_batch=args.per_device_batch,
        attention=args.attention,
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
        "ready to compile: %s, %dx%d, %d steps, %s, %s attention, %d images per request",
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


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Gradio's own start-up checks
    logging.getLogger("jax").setLevel(logging.WARNING)  # backend probing ("Unable to initialize backend 'tpu'")
    args = parse_args(argv)
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
    stop = threading.Event()

    def request_stop(signum, _frame):
        logger.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    launch(demo, host=args.host, port=args.port, share=args.share, prevent_thread_lock=True, quiet=True, auth=args.auth)
    if args.auth:
        logger.info("login required: %d user(s)", len(args.auth))
    logger.info("web UI up in %.2f s", time.perf_counter() - started)
    print(f"Running on {demo.local_url}", flush=True)
    if demo.share_url:
        print(f"Public link: {demo.share_url}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        close_demo(demo)
        cluster.stop()  # STOP to the followers (a no-op on one process)
        logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
