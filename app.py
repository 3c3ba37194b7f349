"""Gradio web app: Stable Diffusion XL on JAX, one image per accelerator core.

    python app.py --model tiny                  # quick offline try with the tiny random-weight model
    python app.py                               # stabilityai/stable-diffusion-xl-base-1.0, 1024x1024, 25 steps

Every option can also come from an environment variable (the flag wins); see `python app.py --help`.
Start-up order: load the model, compile and warm it up, then open the web page, so the first visitor never waits
for a compile. The app is deliberately thin: validation lives in pipeline.validation, styles in pipeline.styles,
and everything JAX in pipeline.generator (this module never imports JAX).
"""

from __future__ import annotations

import argparse
import collections
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

from pipeline import Generator, InvalidInput
from pipeline.loading import ModelLoadError
from pipeline.settings import ATTENTIONS, SDXL_BASE, TINY_MODEL
from pipeline.styles import DEFAULT_STYLE, StyleFileError, load_examples, load_styles
from pipeline.validation import GUIDANCE_MAX, GUIDANCE_MIN, MAX_PROMPT_CHARS, SEED_MAX, PromptFilter, validate_request

logger = logging.getLogger("sdxl_jax.app")

ROOT = pathlib.Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
CSS_PATH = ASSETS / "style.css"
HEADER_PATH = ASSETS / "header.md"
FOOTER_PATH = ASSETS / "footer.md"

TITLE = "Stable Diffusion XL on JAX"
MODEL_CARD_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0"
LICENSE_URL = "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0/blob/main/LICENSE.md"
#: Link to the project's source shown in the header (omitted when empty); SDXL_PROJECT_URL overrides it.
PROJECT_URL = os.environ.get("SDXL_PROJECT_URL", "")
JAX_URL = "https://github.com/jax-ml/jax"
DEFAULT_GUIDANCE = 5.0
DEFAULT_QUEUE_SIZE = 20
GENERATION_FAILED = "Generation failed on the server; please try again."
#: Shape used when --model tiny is given without --height/--width/--steps: starts in seconds on a laptop CPU.
TINY_DEFAULTS = {"height": 128, "width": 128, "steps": 4}
#: Gradio's own cache of served files (every image a user saw): swept every 5 min, files older than 15 min removed.
DELETE_CACHE = (300, 900)
#: Runs whose PNGs we keep on disk until Gradio has copied them into its cache (only one run is in flight).
KEEP_RUNS = 4


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


def header_links() -> str:
    """Markdown links under the title: model card, JAX, and the project's source when PROJECT_URL is set."""
    links = [f"[Model card]({MODEL_CARD_URL})", f"[JAX]({JAX_URL})"]
    if PROJECT_URL:
        links.append(f"[Source code]({PROJECT_URL})")
    return " · ".join(links)


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


def make_generate_fn(
    generator: Any,
    styles: Mapping[str, Any],
    prompt_filter: PromptFilter | None,
    files: _RunFiles,
):
    """The function behind the Generate button and the /generate API endpoint."""

    def generate(
        prompt: str,
        negative_prompt: str = "",
        style: str = DEFAULT_STYLE,
        guidance_scale: float = DEFAULT_GUIDANCE,
        seed: int = 0,
        randomize_seed: bool = True,
    ) -> tuple[list[tuple[str, str]], int, str]:
        """Generate one image per accelerator core.

        Returns the images (PNG files carrying a `parameters` text chunk), the seed used and a status line.
        """
        try:
            request = validate_request(
                prompt,
                negative_prompt,
                style,
                guidance_scale,
                seed,
                randomize_seed,
                styles=styles,
                prompt_filter=prompt_filter,
            )
        except InvalidInput as exc:
            raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None
        started = time.perf_counter()
        try:
            result = generator.generate(
                request.styled_prompt,
                negative_prompt=request.styled_negative_prompt,
                seed=request.seed,
                guidance_scale=request.guidance_scale,
            )
            paths = result.save_pngs(files.new_dir(), stem=f"sdxl-{request.seed}")
        except InvalidInput as exc:  # the engine re-checks what it is given (e.g. a styled prompt over the cap)
            raise gr.Error(str(exc), title="Invalid input", print_exception=False) from None
        except Exception:
            logger.exception("generation failed (seed %d, style %s)", request.seed, request.style)
            raise gr.Error(GENERATION_FAILED, print_exception=False) from None  # logged above
        elapsed = time.perf_counter() - started
        count = len(paths)
        engine_s = float(result.timings.get("total_s", elapsed))
        logger.info(
            "generated %d images: seed %d, style %s, guidance %g, engine %.2f s, with PNGs %.2f s",
            count, request.seed, request.style, request.guidance_scale, engine_s, elapsed,
        )  # fmt: skip
        status = f"{count} image{'s' if count != 1 else ''} in {engine_s:.1f} s · seed {request.seed}"
        if result.truncated:
            gr.Warning(result.truncated)
            status += f"\n\n⚠️ {result.truncated}"
        captions = [f"seed {s}" for s in result.seeds]
        return [(str(p), c) for p, c in zip(paths, captions, strict=True)], request.seed, status

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
    header = _read_template(
        HEADER_PATH,
        title=TITLE,
        device_summary=generator.device_summary,
        count=count,
        width=config.width,
        height=config.height,
        steps=config.steps,
        model=config.model,
        links=header_links(),
    )
    footer = _read_template(FOOTER_PATH, license_url=LICENSE_URL, model_card_url=MODEL_CARD_URL)

    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=DELETE_CACHE) as demo:
        with gr.Column(elem_id="app"):
            gr.Markdown(header, elem_id="header")
            with gr.Row(elem_id="prompt-row", equal_height=True):
                prompt = gr.Textbox(
                    label="Prompt",
                    show_label=False,
                    placeholder="Describe the image you want, then press Enter",
                    lines=1,
                    max_lines=3,
                    max_length=MAX_PROMPT_CHARS,
                    autofocus=True,
                    container=False,
                    scale=5,
                    min_width=240,
                    elem_id="prompt",
                )
                run = gr.Button("Generate", variant="primary", scale=0, min_width=130, elem_id="generate")
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
            status = gr.Markdown("", elem_id="status")
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
                        info="How closely to follow the prompt",
                    )
                negative = gr.Textbox(
                    value="",  # an initial value makes the API parameter optional
                    label="Negative prompt",
                    placeholder="What to keep out of the image",
                    lines=1,
                    max_lines=3,
                    max_length=MAX_PROMPT_CHARS,
                )
                with gr.Row(equal_height=True):
                    seed = gr.Number(
                        label="Seed", value=0, precision=0, minimum=0, maximum=SEED_MAX, step=1, elem_id="seed"
                    )
                    randomize = gr.Checkbox(label="Randomize seed", value=True, elem_id="randomize")
            gr.Examples(examples=[[text] for text in examples], inputs=[prompt], label="Examples")
            gr.Markdown(footer, elem_id="footer")

        gr.on(
            triggers=[run.click, prompt.submit],
            fn=make_generate_fn(generator, styles, prompt_filter, files),
            inputs=[prompt, negative, style, guidance, seed, randomize],
            outputs=[gallery, seed, status],
            api_name="generate",
            api_description="One image per accelerator core; returns the images, the seed used and a status line.",
            # Raw payloads go straight to pipeline.validation, so the API and the page get the same messages
            # (Gradio's own checks would answer out-of-range values and unknown styles in its own words).
            preprocess=False,
            concurrency_limit=1,
            concurrency_id="generate",
            show_progress="full",
        )
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    demo.sdxl_files = files  # type: ignore[attr-defined]  # cleaned up by close_demo()
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
) -> gr.Blocks:
    """Start serving `demo` (Gradio 6 takes the theme and CSS at launch time)."""
    demo.launch(
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
        default=_env("SDXL_MODEL", SDXL_BASE),
        help=f"Hub id, local diffusers Flax directory, or 'tiny' (offline test model) [SDXL_MODEL; {SDXL_BASE}]",
    )
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
        help="image height in pixels, multiple of 8 [SDXL_HEIGHT; default 1024, 128 for tiny]",
    )
    add(
        "--width",
        type=int,
        default=_env("SDXL_WIDTH"),
        help="image width in pixels, multiple of 8 [SDXL_WIDTH; default 1024, 128 for tiny]",
    )
    add("--steps", type=int, default=_env("SDXL_STEPS"), help="denoising steps [SDXL_STEPS; default 25, 4 for tiny]")
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
    add("--share", action="store_true", help="also open a public *.gradio.live link (needs internet)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.queue_size < 1:
        parser.error("--queue-size must be at least 1")
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    if args.model.strip() == TINY_MODEL:
        for key, value in TINY_DEFAULTS.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    return args


def load_generator(args: argparse.Namespace) -> Generator:
    """Load, compile and warm up, logging each phase with its time."""
    shape = {k: getattr(args, k) for k in ("height", "width", "steps") if getattr(args, k) is not None}
    logger.info("loading %s %s", args.model, " ".join(f"{k}={v}" for k, v in shape.items()))
    started = time.perf_counter()
    generator = Generator.from_pretrained(
        args.model, dtype=args.dtype, per_device_batch=args.per_device_batch, attention=args.attention, **shape
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
        generator = load_generator(args)
    except (ModelLoadError, InvalidInput) as exc:
        print(f"app.py: error: {exc}", file=sys.stderr)
        return 2

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
    launch(demo, host=args.host, port=args.port, share=args.share, prevent_thread_lock=True, quiet=True)
    logger.info("web UI up in %.2f s", time.perf_counter() - started)
    print(f"Running on {demo.local_url}", flush=True)
    if demo.share_url:
        print(f"Public link: {demo.share_url}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        close_demo(demo)
        logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
