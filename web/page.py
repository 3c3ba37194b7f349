"""The page: its layout, and its events wired to the handlers (web/handlers.py), in the order Gradio's demos use.

    page = build_page(engine)        # a ready (loaded, warmed-up) engine
    page.launch(port=7860)           # web/server.py's settings: theme, CSS, auth
    page.close()                     # the server, the background PNG writers, and every file this page wrote
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from pipeline.fields import (
    DEFAULT_CFG_END,
    DEFAULT_DEEPCACHE,
    GUIDANCE_MAX,
    GUIDANCE_MIN,
    MAX_DEEPCACHE,
    MAX_PROMPT_CHARS,
    MAX_STEPS,
    SEED_MAX,
)
from pipeline.host.images import model_name
from pipeline.host.plan import SAMPLER_NAMES
from pipeline.request import DEFAULT_STRENGTH, MAX_LORAS
from pipeline.styles import DEFAULT_STYLE, load_examples

from .delivery import Outbox
from .files import RunFiles
from .form import Form
from .handlers import Handlers
from .history_tab import History
from .options import DEFAULT_QUEUE_SIZE
from .prompt_filter import PromptFilter
from .sessions import answers_delivered
from .sizes import size_label
from .texts import (
    HEADER_PATH,
    LICENSE_URL,
    MODEL_CARD_URL,
    NO_CFG_NOTE,
    TITLE,
    gallery_columns,
    header_links,
    model_card_url,
    model_texts,
    read_template,
    sampler_summary,
)

#: Gradio's own cache of served files (every image a user saw) lives in the app's temporary folder (removed at exit);
#: while the app runs it is swept every 5 min and files older than 15 min are removed.
DELETE_CACHE = (300, 900)
#: Requests in the generate event at once: one on the devices while the other does its host work (tokenizing before,
#: writing files after); the engine's device lock keeps device calls one at a time.
GENERATE_CONCURRENCY = 2
#: Seed of example i (fixed, so a cached example shows what its inputs really produce; "Randomize seed" is left as
#: the visitor set it, so the next prompt gets a fresh seed).
EXAMPLE_SEED_START = 1
#: Seconds a stopping server gives its running requests to end (at their next step) and answer why, within
#: `docker stop`'s 10 s before it kills.
STOP_GRACE_S = 5.0


@dataclass
class Page:
    """The page around one engine: the Gradio app, its handlers, and the files and PNG writers it owns."""

    demo: gr.Blocks  # the Gradio app (launch with `launch`)
    handlers: Handlers  # what its events run
    files: RunFiles  # this page's temporary files
    outbox: Outbox  # writes each run's gallery files and, in the background, its PNGs
    history: History  # past generations (the server's, the browser's, or none)
    form: Form  # the fields settings fill back (History's "Use these settings", PNG Info)

    @property
    def local_url(self) -> str:
        return self.demo.local_url

    def launch(self, **settings) -> Page:
        """Start serving (settings: web/server.launch's keywords)."""
        from .server import launch

        launch(self.demo, middleware=[self.handlers.early_cancels.middleware(), *self.history.middleware()],
               **settings)  # fmt: skip
        return self

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the server, the background PNG writers and the history's, and remove this page's files.

        First every request ends at its next step and answers why (web/handlers.Handlers.shut_down), and its client
        is handed that answer, within `grace_s`; then Gradio's server stops (it waits for open streams)."""
        deadline = time.monotonic() + grace_s
        self.handlers.shut_down(grace_s)
        while not answers_delivered(self.demo) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.demo.close()
        self.outbox.close()
        self.history.close()
        self.files.cleanup()


def header_text(engine: Any, texts: dict[str, str]) -> str:
    """The header under the title: devices, images per request, size, steps, the model (assets/header.md)."""
    config, count, sizes = engine.config, engine.num_images, engine.rules.sizes
    return read_template(
        HEADER_PATH,
        title=TITLE,
        device_summary=engine.device_summary,
        count=count,
        images=f"{count} image{'s' if count != 1 else ''}",
        width=sizes[0][1],
        height=sizes[0][0],
        steps=config.steps,
        model=model_name(config.model),
        more_sizes=f" (or {len(sizes) - 1} other size{'s' if len(sizes) > 2 else ''})" if len(sizes) > 1 else "",
        about=texts["about"],
        notice=texts["notice"],
        links=header_links(config.model),
    )


def build_page(
    engine: Any,
    *,
    styles: Mapping[str, Any] | None = None,
    examples: Sequence[str] | None = None,
    prompt_filter: PromptFilter | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    progress: bool = True,
    history: History | None = None,
    logins: bool = False,
) -> Page:
    """Build the page around a ready (loaded and warmed-up) engine. Launch it with `Page.launch`. `history`: where
    past generations go (web/history_tab.py; none by default). `logins`: the page is launched with `auth` (a Log out
    button, to Gradio's /logout)."""
    examples = load_examples() if examples is None else list(examples)
    rules = engine.rules if styles is None else replace(engine.rules, styles=styles)
    files = RunFiles()  # first: Gradio reads its cache folder when it makes each component
    outbox = Outbox()
    history = history or History.off()
    history.files = files
    handlers = Handlers(engine, rules, files=files, outbox=outbox, prompt_filter=prompt_filter, progress=progress,
                        on_finished=history.keep)  # fmt: skip
    config = engine.config
    texts = model_texts(config.model, on_cpu=str(engine.device_kind).lower() == "cpu", unet=config.unet)
    size_labels = [size_label(h, w) for h, w in rules.sizes]
    footer = read_template(
        pathlib.Path(texts["footer_path"]),
        license_url=LICENSE_URL,
        model_card_url=model_card_url(config.model) or MODEL_CARD_URL,
        model=model_name(config.model),
    )

    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=DELETE_CACHE) as demo:
        history_state = history.state()  # the visitor's entries when their browser keeps them
        with gr.Column(elem_id="app"):
            gr.Markdown(header_text(engine, texts), elem_id="header")
            if logins:  # Gradio's own route: forgets the login, back to its login form (relative: works under a proxy)
                gr.Button("Log out", link="logout", size="sm", variant="secondary", scale=0, elem_id="logout")
            # Without a history the page has one tab: its tab bar is hidden (assets/style.css).
            with gr.Tabs(elem_id="tabs", elem_classes=[] if history.enabled else ["one-tab"]) as tabs:
                with gr.Tab("Generate", id="generate", elem_id="generate-tab"):
                    with gr.Row(elem_id="prompt-row", equal_height=True):
                        prompt = gr.Textbox(
                            label="Prompt",
                            show_label=False,
                            placeholder="Describe the image you want",
                            lines=1,
                            max_lines=3,  # no max_length: a longer prompt gets a message naming the limit
                            autofocus=True,
                            container=False,
                            scale=5,
                            min_width=240,
                            elem_id="prompt",
                        )
                        run = gr.Button("Generate", variant="primary", scale=0, min_width=130, elem_id="generate")
                        # Grey while idle, red while this tab's request runs (assets/style.css)
                        stop = gr.Button("Stop", variant="secondary", scale=0, min_width=90, elem_id="stop")
                    gallery = gr.Gallery(
                        label="Generated images",
                        show_label=False,
                        columns=gallery_columns(engine.num_images),
                        format="jpeg",  # what the page shows: fast to encode, light to send; the PNGs are below
                        type="filepath",
                        object_fit="contain",
                        height="auto",
                        preview=False,
                        interactive=False,
                        buttons=["download", "fullscreen"],
                        elem_id="gallery",
                    )
                    with gr.Row(elem_id="vary-row"):
                        vary_subtle = gr.Button("Vary (subtle)", size="sm", variant="secondary",
                                                elem_id="vary-subtle")  # fmt: skip
                        vary_strong = gr.Button("Vary (strong)", size="sm", variant="secondary",
                                                elem_id="vary-strong")  # fmt: skip
                        # PNG Info: an image's parameters fill the form (also an image dropped anywhere on the
                        # page outside the picture inputs: assets/page.js).
                        settings_image = gr.UploadButton(
                            "Use an image's settings", file_count="single", type="filepath", size="sm",
                            file_types=[".png", ".jpg", ".jpeg", ".webp"], variant="secondary",
                            elem_id="settings-image",
                        )  # fmt: skip
                    status = gr.Markdown("", label="status", elem_id="status")  # the label names the API's third output
                    api_button = gr.Button(visible=False, elem_id="generate-api")  # /generate (files as inputs)
                    png_api = gr.Button(visible=False, elem_id="generate-png")  # only /generate_png uses it
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
                                choices=list(rules.styles), value=DEFAULT_STYLE, label="Style", allow_custom_value=False
                            )
                            guidance = gr.Slider(
                                minimum=GUIDANCE_MIN,
                                maximum=GUIDANCE_MAX,
                                value=rules.guidance_scale,
                                step=0.5,
                                label="Guidance scale",
                                info=f"How closely to follow the prompt ({GUIDANCE_MIN:g} to {GUIDANCE_MAX:g}; "
                                "a number typed outside is set to the nearest limit)",
                                visible=rules.cfg,  # static: the guidance-free program has no guidance
                                elem_id="guidance",
                            )
                        negative = gr.Textbox(
                            value="",  # an initial value makes the API parameter optional
                            label="Negative prompt",
                            placeholder="What to keep out of the image",
                            info=f"Up to {MAX_PROMPT_CHARS:,} characters, like the prompt",
                            lines=1,
                            max_lines=3,
                            visible=rules.cfg,
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
                                value=int(rules.steps),
                                step=1,
                                label="Steps",
                                info=f"Denoising steps, 1 to {MAX_STEPS}; any number runs without recompiling (a "
                                "number typed outside is set to the nearest limit)",
                                elem_id="steps",
                            )
                            sampler = gr.Dropdown(
                                choices=list(SAMPLER_NAMES),
                                value=rules.sampler,
                                label="Sampler",
                                allow_custom_value=False,
                                elem_id="sampler",
                            )
                        with gr.Row(equal_height=True, visible=rules.levers):
                            cfg_end = gr.Slider(
                                minimum=0.05,
                                maximum=1,
                                value=DEFAULT_CFG_END,
                                step=0.05,
                                label="Guidance for the first part of the steps",
                                info="1 = every step (exact); 0.5 = the first half: faster, changes the picture",
                                visible=rules.cfg,
                                elem_id="cfg-end",
                            )
                            deepcache = gr.Slider(
                                minimum=1,
                                maximum=MAX_DEEPCACHE,
                                value=DEFAULT_DEEPCACHE,
                                step=1,
                                label="DeepCache",
                                info="1 = off (exact); N = the whole UNet every N steps, its shallow part between: "
                                "faster, changes the picture",
                                elem_id="deepcache",
                            )
                        lora_rows = []
                        with gr.Group(visible=bool(rules.loras), elem_id="lora-picker"):
                            gr.Markdown(f"LoRA: up to {MAX_LORAS} at once (or `<lora:NAME:WEIGHT>` in the prompt)")
                            for slot in range(MAX_LORAS):
                                with gr.Row(equal_height=True):
                                    lora_rows.append(gr.Dropdown(
                                        choices=[("none", "")] + [(name, name) for name in rules.loras], value="",
                                        label=f"LoRA {slot + 1}", show_label=False, scale=3, elem_id=f"lora-{slot + 1}",
                                    ))  # fmt: skip
                                    lora_rows.append(gr.Slider(
                                        minimum=-2, maximum=2, value=1, step=0.05, label="Weight", scale=2,
                                        elem_id=f"lora-weight-{slot + 1}",
                                    ))  # fmt: skip
                        loras = gr.JSON(value=[], visible=False, label="loras")  # the picker as the API's `loras`
                        with gr.Accordion("Start from a picture", open=False, elem_id="picture-settings"):
                            with gr.Row(equal_height=True):
                                init_image = gr.Image(
                                    label="Picture (upload or paste)", type="filepath", sources=["upload", "clipboard"],
                                    elem_id="init-image",
                                )  # fmt: skip
                                picture = gr.ImageMask(  # the picture again, to paint the mask on
                                    label="Paint over what to redraw (nothing painted: all of it)", type="filepath",
                                    sources=[], layers=False, elem_id="mask-editor",
                                )  # fmt: skip
                            strength = gr.Slider(
                                minimum=0.05, maximum=1, value=DEFAULT_STRENGTH, step=0.05, label="Strength",
                                info="How much of the picture is redrawn: 0.3 keeps most of it, 1 redraws it all",
                                elem_id="strength",
                            )  # fmt: skip
                        mask_image = gr.Image(type="filepath", visible=False, label="mask_image")  # the API's mask file
                        # the API's previews=False: no pictures forming streamed, no preview program run
                        previews = gr.Checkbox(value=True, visible=False, label="previews")
                        if summary := sampler_summary(engine):  # fixed at start-up; jargon, so not in the header
                            gr.Markdown(f"Server defaults: {summary} · {config.steps} steps", elem_id="server-settings")
                    inputs = [prompt, negative, style, guidance, seed, randomize, aspect, steps, sampler, cfg_end,
                              deepcache, loras, init_image, mask_image, strength, previews]  # the API's  # fmt: skip
                    # An example fills the prompt and the settings; its seed is fixed: its kept images are honest.
                    example_seeds = {text: EXAMPLE_SEED_START + i for i, text in enumerate(examples)}
                    with gr.Column(visible=bool(examples), elem_id="examples"):
                        gr.Markdown("Examples", elem_classes=["examples-label"])
                        with gr.Row(elem_classes=["example-buttons"]):
                            example_buttons = [
                                gr.Button(text, size="sm", variant="secondary", elem_classes=["example"])
                                for text in examples
                            ]  # fmt: skip
                history_tab = history.layout(history_state)  # None when the server keeps no history
            gr.Markdown(footer, elem_id="footer")

        # ---- events ----
        form = Form(  # the fields that settings fill back: History's "Use these settings", an image's parameters
            prompt=prompt, negative=negative, style=style, guidance=guidance, seed=seed, randomize=randomize,
            aspect=aspect, steps=steps, sampler=sampler, cfg_end=cfg_end, deepcache=deepcache,
            lora_rows=tuple(lora_rows), strength=strength, styles=tuple(rules.styles), sizes=tuple(rules.sizes),
            samplers=tuple(SAMPLER_NAMES), loras=tuple(rules.loras),
        )  # fmt: skip
        # A new request clears the last one's status line at once (in the browser), so a refused request never
        # leaves an older request's "8 images in ..." under its error.
        gr.on(triggers=[run.click, prompt.submit], fn=None, js="() => ''", outputs=[status], api_visibility="private")
        generating = {  # the page's Generate and the API's /generate run one function, in one concurrency group
            "fn": handlers.endpoint(),
            "outputs": [gallery, seed, status],
            # Raw payloads go straight to pipeline.request, so the API and the page get the same messages
            # (Gradio's own checks would answer out-of-range values and unknown styles in its own words).
            "preprocess": False,
            "concurrency_limit": GENERATE_CONCURRENCY,
            "concurrency_id": "generate",
        }
        page_generating = {  # the page's own: its picture editor too; one "step k / N" bar and error badge
            **generating, "inputs": [*inputs, picture], "api_name": "page_generate", "api_visibility": "private",
            "show_progress": "full", "show_progress_on": [gallery],
        }  # fmt: skip
        generated = gr.on(triggers=[run.click, prompt.submit], **page_generating)
        api_button.click(
            inputs=inputs,
            api_name="generate",
            api_description="One image per accelerator core; returns the images, the seed used and a status line."
            + ("" if rules.cfg else f" Note: {NO_CFG_NOTE}."),
            **generating,
        )
        # The picture goes to the mask editor as its background (strokes start afresh).
        init_image.change(fn=handlers.picture_uploaded, inputs=init_image, outputs=[init_image, picture],
                          preprocess=False, api_visibility="private")  # fmt: skip
        # Vary: the clicked result as the picture, subtle (0.5) or strong (0.85) as Fooocus offers, then generate.
        gallery.select(handlers.select, inputs=None, outputs=None, queue=False, api_visibility="private")
        varied = [
            button.click(handlers.vary(amount), inputs=None, outputs=[init_image, picture, strength],
                         api_visibility="private").success(**page_generating)
            for button, amount in ((vary_subtle, 0.5), (vary_strong, 0.85))
        ]  # fmt: skip
        # The page's follow-up: the lossless PNGs of the images this session was just shown (written in the
        # background; matched by file name, so no path a browser sends is ever opened).
        for answered in (generated, *varied):
            answered.success(
                fn=handlers.pngs,
                inputs=None,
                outputs=pngs,
                api_visibility="private",  # API callers use /generate_png
                show_progress="hidden",
                concurrency_limit=4,  # it only waits on the background pool
                concurrency_id="pngs",
            )
        gr.on(
            triggers=[row.change for row in lora_rows], fn=handlers.picked_loras, inputs=lora_rows, outputs=loras,
            queue=False, api_visibility="private",
        )  # fmt: skip
        # An example (web/examples.py): its settings into the form, then its images (kept after its first click) with
        # the PNG list of the last request hidden (it no longer matches them).
        example_fields = [prompt, negative, style, guidance, aspect]
        run_example = handlers.example(example_seeds, EXAMPLE_SEED_START)

        def example_settings(text: str):
            return lambda: (text, "", DEFAULT_STYLE, rules.guidance_scale, size_labels[0])

        for text, button in zip(examples, example_buttons, strict=True):
            button.click(
                fn=example_settings(text), inputs=None,
                outputs=example_fields, queue=False, api_visibility="private",
            ).then(
                fn=lambda: gr.update(value=None, visible=False), inputs=None, outputs=pngs, queue=False,
                api_visibility="private",
            ).then(
                fn=run_example, inputs=example_fields, outputs=[gallery, seed, status], preprocess=False,
                concurrency_limit=GENERATE_CONCURRENCY, concurrency_id="generate", show_progress="full",
                show_progress_on=[gallery], api_visibility="private",
            )  # fmt: skip
        # Not queued: it must run while this session's generation holds the queue.
        stop.click(handlers.stop, inputs=None, outputs=None, queue=False, api_visibility="private")
        png_api.click(
            fn=handlers.endpoint("png"),
            inputs=inputs,
            outputs=[gallery, seed, status],
            api_name="generate_png",
            api_description="The same as /generate, but the images are lossless PNGs with a `parameters` text chunk "
            "(slower to encode and about 8x larger than /generate's JPEGs).",
            preprocess=False,
            concurrency_limit=GENERATE_CONCURRENCY,  # a group takes its events' lowest limit: give the same
            concurrency_id="generate",  # shares /generate's slots
        )
        # PNG Info: a dropped image's parameters fill the form (the file is read once, then cleared).
        settings_image.upload(form.from_image, inputs=settings_image, outputs=[*form.fields, settings_image],
                              api_visibility="private", show_progress="hidden")  # fmt: skip
        if history_tab is not None:
            history.wire(history_tab, form, tabs, generated=[generated, *varied])
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return Page(demo=demo, handlers=handlers, files=files, outbox=outbox, history=history, form=form)
