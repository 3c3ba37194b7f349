"""The page: its layout in sections, then its events wired to the handlers (web/page/handlers.py), as Gradio's demos
write a page. The request fields' controls come from the table (`pipeline.contract.fields.FIELDS`): a plain field
without a place below gets its control in the advanced settings.

    page = build_page(engine)        # a ready (loaded, warmed-up) engine
    page.launch(port=7860)           # web/serving/server.py's settings: theme, CSS, auth
    page.close()                     # the server, the background PNG writers, and every file this page wrote
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from pipeline.contract.engine import REQUESTS_AT_ONCE, Engine, EngineSettings
from pipeline.contract.fields import FIELD, FIELDS, MAX_PROMPT_CHARS, PLAIN, Field
from pipeline.contract.parameters import model_name
from pipeline.contract.request import MAX_LORAS, UNET_EXTRAS, RequestRules, offered_row
from pipeline.contract.styles import DEFAULT_STYLE, load_examples
from pipeline.contract.xyz_plot import MAX_CELLS

from ..gradio_internals import answers_delivered, event_index
from ..history.tab import History
from ..options import DEFAULT_QUEUE_SIZE
from ..serving import server
from ..serving.outbox import Outbox
from ..serving.temp_files import RunFiles
from ..serving.twin_routing import Twin
from .controlnet_panel import control_panel
from .form import Form, control
from .handlers import Handlers
from .image_prompt_panel import image_prompt_panel
from .outpaint_panel import outpaint_panel
from .prompt_filter import PromptFilter
from .size_labels import size_label
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
from .xyz_panel import plot_endpoint, xyz_section

#: Gradio's own cache of served files (every image a user saw) lives in the app's temporary folder (removed at exit);
#: while the app runs it is swept every 5 min and files older than 15 min are removed.
DELETE_CACHE = (300, 900)
#: Requests in the generate event at once, unless the engine says (its `concurrency`): contract/engine.py.
GENERATE_CONCURRENCY = REQUESTS_AT_ONCE


def generate_concurrency(engine) -> int:
    """The requests the "generate" concurrency group runs at once for `engine`: its own `concurrency` (engine
    services: two per engine; a merging engine: twice --images-per-device), else GENERATE_CONCURRENCY. Every event of
    the group must take it: Gradio keeps a group's lowest limit."""
    return getattr(engine, "concurrency", GENERATE_CONCURRENCY)


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
        """Start serving (settings: web/serving/server.launch's keywords; `middleware` joins the page's own)."""
        middleware = [
            self.handlers.early_cancels.middleware(),
            self.handlers.twin_routing.middleware(),
            *self.history.middleware(),
            *settings.pop("middleware", ()),
        ]
        server.launch(self.demo, middleware=middleware, **settings)
        return self

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the server, the background PNG writers and the history's, and remove this page's files.

        First every request ends at its next step and answers why (web/page/handlers.Handlers.shut_down), and its client
        is handed that answer, within `grace_s`; then Gradio's server stops (it waits for open streams)."""
        deadline = time.monotonic() + grace_s
        self.handlers.shut_down(grace_s)
        while not answers_delivered(self.demo) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.demo.close()
        self.outbox.close()
        self.history.close()
        self.files.cleanup()


def header_text(engine: Engine, texts: dict[str, str]) -> str:
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
    engine: Engine,
    *,
    styles: Mapping[str, Any] | None = None,
    examples: Sequence[str] | None = None,
    prompt_filter: PromptFilter | None = None,
    queue_size: int = DEFAULT_QUEUE_SIZE,
    progress: bool = True,
    history: History | None = None,
    logins: bool = False,
    xyz_max_cells: int = MAX_CELLS,
) -> Page:
    """Build the page around a ready (loaded and warmed-up) engine. Launch it with `Page.launch`. `history`: where
    past generations go (web/history/tab.py; none by default). `logins`: the page is launched with `auth` (a Log out
    button, to Gradio's /logout)."""
    examples = load_examples() if examples is None else list(examples)
    rules = engine.rules if styles is None else replace(engine.rules, styles=styles)
    files = RunFiles()  # first: Gradio reads its cache folder when it makes each component
    outbox = Outbox()
    history = history or History.off()
    history.files = files
    handlers = Handlers(
        engine,
        rules,
        files=files,
        outbox=outbox,
        prompt_filter=prompt_filter,
        progress=progress,
        on_finished=history.keep,
        xyz_max_cells=xyz_max_cells,
    )
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=DELETE_CACHE) as demo:
        sections = page_sections(engine, rules, examples, history, logins)
        # ---- events ----
        form = settings_form(sections, rules)
        concurrency = generate_concurrency(engine)
        top, shown, fields = sections.top, sections.shown, sections.fields
        generated = wire_generate(handlers, rules, top, shown, fields, concurrency)
        generated.append(wire_plot(handlers, sections.xyz, top, shown, fields, concurrency))
        wire_examples(handlers, rules, examples, sections.buttons, top, shown, fields, concurrency)
        wire_settings_image(shown, form)
        if sections.history_tab is not None:
            history.wire(sections.history_tab, form, sections.tabs, generated=generated)
    demo.queue(max_size=queue_size, default_concurrency_limit=1)
    return Page(demo=demo, handlers=handlers, files=files, outbox=outbox, history=history, form=form)


@dataclass(frozen=True)
class Sections:
    """The page's parts that its events wire."""

    top: PromptRow  # the prompt, the picture in use, Generate and Stop
    shown: Results  # the gallery and what acts on it
    fields: Fields  # the advanced settings
    buttons: list  # the examples
    tabs: gr.Tabs  # Generate, and the history's when there is one
    history_tab: Any  # the history's parts (None without a history)
    xyz: tuple  # the X/Y/Z plot's axes (A1111's script_args order) and its "Run plot"


def page_sections(
    engine: Engine, rules: RequestRules, examples: Sequence[str], history: History, logins: bool
) -> Sections:
    """The page's layout, top to bottom: the header, the Generate tab (prompt, results, advanced settings,
    examples), the history's tab and the footer."""
    texts = model_texts(
        engine.config.model,
        on_cpu=str(engine.device_kind).lower() == "cpu",
        unet=engine.config.unet,
        unet_parameters=getattr(engine, "unet_parameters", None),
    )
    history_state = history.state()  # the visitor's entries when their browser keeps them
    with gr.Column(elem_id="app"):
        gr.Markdown(header_text(engine, texts), elem_id="header")
        if logins:  # Gradio's own route: forgets the login, back to its login form (relative: works under a proxy)
            gr.Button("Log out", link="logout", size="sm", variant="secondary", scale=0, elem_id="logout")
        # Without a history the page has one tab: its tab bar is hidden (assets/style.css).
        with gr.Tabs(elem_id="tabs", elem_classes=[] if history.enabled else ["one-tab"]) as tabs:
            with gr.Tab("Generate", id="generate", elem_id="generate-tab"):
                top = prompt_row()
                shown = results(engine.num_images)
                with gr.Accordion("Advanced settings", open=False, elem_id="advanced"):
                    fields = advanced_settings(rules, engine)
                xyz = xyz_section()
                buttons = example_buttons(examples)
            history_tab = history.layout(history_state)  # None when the server keeps no history
        gr.Markdown(footer_text(engine.config, texts), elem_id="footer")
    return Sections(top, shown, fields, buttons, tabs, history_tab, xyz)


def settings_form(sections: Sections, rules: RequestRules) -> Form:
    """The fields that settings fill back: History's "Use these settings", an image's parameters (PNG Info)."""
    return Form(
        controls={
            "prompt": sections.top.prompt,
            **{
                name: component
                for name, component in sections.fields.controls.items()
                if name
                not in ("loras", "init_image", "mask_image", "controlnets", "ip_images", "outpaint", "region_mask")
            },
        },
        lora_rows=sections.fields.lora_rows,
        styles=tuple(rules.styles),
        sizes=tuple(rules.sizes),
        loras=tuple(rules.loras),
        refiner=getattr(rules, "refiner", ""),
        hires_scales=tuple(getattr(rules, "hires_scales", ())),
        extras=tuple(name for name in UNET_EXTRAS if getattr(rules, name, False)),
    )


def wire_settings_image(shown: Results, form: Form) -> None:
    """PNG Info: a dropped image's parameters fill the form (the file is read once, then cleared)."""
    shown.settings_image.upload(
        form.from_image,
        inputs=shown.settings_image,
        outputs=[*form.fields, shown.settings_image],
        api_visibility="private",
        show_progress="hidden",
    )


def footer_text(config: EngineSettings, texts: dict[str, str]) -> str:
    """The footer: the model's licence and card (assets/footer*.md)."""
    return read_template(
        pathlib.Path(texts["footer_path"]),
        license_url=LICENSE_URL,
        model_card_url=model_card_url(config.model) or MODEL_CARD_URL,
        model=model_name(config.model),
    )


# ---- layout ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptRow:
    prompt: gr.Textbox
    run: gr.Button
    stop: gr.Button
    run_painted: gr.Button  # Generate once a mask is painted (hidden: assets/page.js presses it instead of `run`)
    chip: gr.Column  # the picture Generate starts from, beside it (hidden while there is none)
    chip_image: gr.Image  # its thumbnail
    drop: gr.Button  # its ✕: no picture


def prompt_row() -> PromptRow:
    """The prompt, the picture in use (a chip with a ✕, shown only while Generate starts from a picture: its input
    sits two closed accordions deep), Generate and Stop."""
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
        with (
            gr.Column(scale=0, min_width=0, visible=False, elem_id="picture-chip") as chip,
            gr.Row(equal_height=True, elem_id="picture-chip-row"),
        ):
            chip_image = gr.Image(
                label="Generate starts from this picture",
                show_label=False,
                type="filepath",
                interactive=False,
                container=False,
                buttons=[],
                height=48,
                width=48,
                min_width=0,
                scale=0,
                elem_id="picture-chip-image",
            )
            drop = gr.Button("✕", size="sm", variant="secondary", scale=0, min_width=0, elem_id="drop-picture")
        run = gr.Button("Generate", variant="primary", scale=0, min_width=130, elem_id="generate")
        # Grey while idle, red while this tab's request runs (assets/style.css)
        stop = gr.Button("Stop", variant="secondary", scale=0, min_width=90, elem_id="stop")
    # In the page (for assets/page.js to press), never seen: Generate with the mask editor's strokes.
    run_painted = gr.Button("Generate", visible="hidden", elem_id="generate-painted")
    return PromptRow(prompt, run, stop, run_painted, chip, chip_image, drop)


@dataclass(frozen=True)
class Results:
    gallery: gr.Gallery
    vary: tuple[tuple[gr.Button, float], ...]  # (button, strength): subtle and strong
    use: gr.Button  # "Use as picture": the clicked result into "Start from a picture" (kept until its ✕)
    settings_image: gr.UploadButton
    status: gr.Markdown
    api_button: gr.Button
    png_api: gr.Button
    pngs: gr.File


def results(num_images: int) -> Results:
    """The gallery, Vary, "Use as picture", PNG Info's upload, the status line, the lossless PNGs and the API's
    hidden buttons."""
    gallery = gr.Gallery(
        label="Generated images",
        show_label=False,
        columns=gallery_columns(num_images),
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
        # Vary: the clicked result redrawn, subtle (0.5) or strong (0.85) as Fooocus offers; one-shot.
        vary = tuple(
            (gr.Button(f"Vary ({name})", size="sm", variant="secondary", elem_id=f"vary-{name}"), amount)
            for name, amount in (("subtle", 0.5), ("strong", 0.85))
        )
        # A1111's "Send to img2img": the clicked result as the picture every Generate starts from, until its ✕.
        use = gr.Button("Use as picture", size="sm", variant="secondary", elem_id="use-picture")
        # PNG Info: an image's parameters fill the form (also an image dropped anywhere on the page outside the
        # picture inputs: assets/page.js).
        settings_image = gr.UploadButton(
            "Use an image's settings",
            file_count="single",
            type="filepath",
            size="sm",
            file_types=[".png", ".jpg", ".jpeg", ".webp"],
            variant="secondary",
            elem_id="settings-image",
        )
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
    return Results(gallery, vary, use, settings_image, status, api_button, png_api, pngs)


@dataclass(frozen=True)
class Fields:
    controls: dict[str, Any]  # the request fields' components by table name, but the prompt's
    lora_rows: tuple  # the LoRA picker: name, weight, name, weight, ...
    picture: gr.ImageMask  # the mask editor
    previews: gr.Checkbox  # the API's `previews` (hidden; False: an API caller gets none unless it asks)
    page_previews: gr.Checkbox  # the page's own `previews` (hidden; True: previews are for eyes)

    def inputs(self, prompt: gr.Textbox) -> list:
        """The API's parameters: the request fields in the table's order, then `previews`."""
        return [*(prompt if row.name == "prompt" else self.controls[row.name] for row in FIELDS), self.previews]

    def page_inputs(self, prompt: gr.Textbox, *, painted: bool = False) -> list:
        """The page's Generate's: the API's, asking for previews, then (`painted`) the mask editor.

        The editor is an input only once something is painted: as an event's input it exports and uploads its picture,
        strokes and composite (three PNGs at the picture's size: seconds in a browser without a GPU), though only the
        strokes make a mask and a request without any needs none of them (assets/page.js chooses the event)."""
        return [*self.inputs(prompt)[:-1], self.page_previews, *([self.picture] if painted else [])]


def advanced_settings(rules: RequestRules, engine: Engine) -> Fields:
    """Every request field's control but the prompt: the table's plain fields, the style, seed, size, the LoRA
    picker and the picture to start from."""
    controls: dict[str, Any] = {**style_settings(rules), **seed_and_size(rules)}
    with gr.Row(equal_height=True):
        controls.update(table_controls("sampling", rules))
    with gr.Row(equal_height=True, visible=rules.levers):
        controls.update(table_controls("levers", rules))
    lora_rows, controls["loras"] = lora_settings(rules)
    picture_controls, picture = picture_settings(rules, controls["aspect_ratio"])
    controls.update(picture_controls)
    controls["ip_images"] = image_prompt_panel(rules)
    controls["controlnets"] = control_panel(rules)
    controls.update(hires_panel(rules))
    controls.update(region_panel(rules))
    # `previews`: the pictures forming streamed (a preview program run every 2 steps, and every preview's files
    # fetched by gradio_client). The API's default is none; the page's Generate asks for them.
    previews = gr.Checkbox(value=False, visible=False, label="previews")
    page_previews = gr.Checkbox(value=True, visible=False, label="page previews")
    for row in PLAIN:  # a field of a group the layout above does not place: a row of its own
        if row.name not in controls:
            with gr.Row(equal_height=True):
                controls.update(table_controls(row.control.group, rules, only=row.name))
    if summary := sampler_summary(engine):  # fixed at start-up; jargon, so not in the header
        gr.Markdown(f"Server defaults: {summary} · {engine.config.steps} steps", elem_id="server-settings")
    return Fields(controls, lora_rows, picture, previews, page_previews)


def style_settings(rules: RequestRules) -> dict[str, Any]:
    """The style (with the table's fields of its row) and the negative prompt (hidden without CFG)."""
    controls: dict[str, Any] = {}
    with gr.Row():
        controls["style"] = gr.Dropdown(
            choices=list(rules.styles), value=DEFAULT_STYLE, label="Style", allow_custom_value=False
        )
        controls.update(table_controls("style", rules))
    controls["negative_prompt"] = gr.Textbox(
        value="",  # an initial value makes the API parameter optional
        label="Negative prompt",
        placeholder="What to keep out of the image",
        info=f"Up to {MAX_PROMPT_CHARS:,} characters, like the prompt",
        lines=1,
        max_lines=3,
        visible=rules.cfg,
    )
    return controls


def seed_and_size(rules: RequestRules) -> dict[str, Any]:
    """The seed and "Randomize seed", then the aspect ratio: one of the server's compiled sizes."""
    controls: dict[str, Any] = {}
    seed = FIELD["seed"]
    with gr.Row(equal_height=True):
        controls["seed"] = gr.Number(
            label="Seed", value=seed.default, precision=0, minimum=seed.low, maximum=seed.high, step=1, elem_id="seed"
        )
        controls["randomize_seed"] = gr.Checkbox(label="Randomize seed", value=True, elem_id="randomize")
    size_labels = [size_label(h, w) for h, w in rules.sizes]
    controls["aspect_ratio"] = gr.Dropdown(
        choices=size_labels,
        value=size_labels[0],
        label="Aspect ratio",
        info="Width×height; every size is precompiled",
        allow_custom_value=False,
        elem_id="aspect",
    )
    return controls


def lora_settings(rules: RequestRules) -> tuple[tuple, gr.JSON]:
    """The LoRA picker's rows, the offered embeddings' names, and the hidden `loras` control the picker fills (the
    API's `loras`)."""
    lora_rows = lora_picker(rules)
    embeddings = tuple(getattr(rules, "embeddings", ()))  # --embeddings-dir: a name in a prompt puts its vectors
    gr.Markdown(
        "Embeddings (write the name in a prompt or negative prompt): " + ", ".join(f"`{name}`" for name in embeddings),
        visible=bool(embeddings),
        elem_id="embeddings",
    )
    loras = gr.JSON(value=[], visible=False, label="loras")  # the picker as the API's `loras`
    # described as a list: a schema-checking client (MCP's) rejects the "any type" a JSON component says it takes
    loras.api_info = lambda: {
        "type": "array",
        "items": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}},
        "description": "[[name, weight], ...]",
    }
    return lora_rows, loras


def picture_settings(rules: RequestRules, size: gr.Dropdown) -> tuple[dict[str, Any], gr.ImageMask]:
    """The "Start from a picture" section: the picture, the mask editor over it, the table's picture fields, how the
    mask is used, and the Outpaint choice (web/page/outpaint_panel.py, its canvas at the chosen `size`); then the API's
    hidden mask file. Returns the controls and the mask editor."""
    controls: dict[str, Any] = {}
    with gr.Accordion("Start from a picture", open=False, elem_id="picture-settings"):
        with gr.Row(equal_height=True):
            controls["init_image"] = gr.Image(
                label="Picture (upload or paste)",
                type="filepath",
                sources=["upload", "clipboard"],
                elem_id="init-image",
            )
            picture = gr.ImageMask(  # the picture again, to paint the mask on
                label="Paint over what to redraw (nothing painted: all of it)",
                type="filepath",
                sources=[],
                layers=False,
                elem_id="mask-editor",
            )
        controls.update(table_controls("picture", rules))
        with gr.Row(equal_height=True):
            controls.update(table_controls("mask", rules))
        controls["outpaint"] = outpaint_panel(rules, controls["init_image"], size)
    controls["mask_image"] = gr.Image(type="filepath", visible=False, label="mask_image")  # the API's mask file
    return controls, picture


#: What the "Second pass" section says on a server without hires scales: how to offer them.
NO_HIRES = (
    "This server has no hires fix: its sizes are compiled at start-up, so it is started with them, e.g. "
    "`--hires-scales 1.5,2`."
)


def hires_panel(rules: RequestRules) -> dict[str, Any]:
    """The hires fix's controls in a "Second pass" section. Upscale by offers the server's compiled scales only (any
    other would be refused); without any, it says how to offer them (`NO_HIRES`) and the other controls are hidden."""
    scales = tuple(getattr(rules, "hires_scales", ()))
    with gr.Accordion("Second pass", open=False, elem_id="hires-settings"):
        gr.Markdown(
            "Hires fix: the picture drawn, upscaled and redrawn. Upscale by 1 (off) or "
            + ", ".join(f"{scale:g}" for scale in scales)
            if scales
            else NO_HIRES,
            elem_id="hires-scales",
        )
        with gr.Row(equal_height=True):
            return table_controls("hires", rules)


def region_panel(rules: RequestRules) -> dict[str, Any]:
    """Regional prompts in a "Regions" section: Regional Prompter's divide syntax, or a painted mask (one colour per
    region), and the base ratio; the prompt's parts are split on BREAK."""
    counts = ", ".join(map(str, (1, *getattr(rules, "region_parts", ()))))
    controls: dict[str, Any] = {}
    with gr.Accordion("Regions", open=False, elem_id="region-settings"):
        gr.Markdown(
            f"Each part of the prompt (split on BREAK) drawn in its region; this server draws {counts} parts. "
            "With a base ratio above 0 the first part is the base, drawn everywhere.",
            elem_id="region-note",
        )
        with gr.Row(equal_height=True):
            controls["regions"] = gr.Textbox(
                value="",  # an initial value makes the API parameter optional
                label="Regions",
                placeholder="columns 1,1 · rows 1,2 · columns 1,1;1,2,1",
                elem_id="regions",
            )
            controls["region_mask"] = gr.Image(
                label="Or paint the regions (one colour each, on black)",
                type="filepath",
                sources=["upload", "clipboard"],
                elem_id="region-mask",
            )
            controls.update(table_controls("regions", rules))
    return controls


def hires_scale_control(row: Field, scales: Sequence[float], **layout) -> gr.Radio:
    """Upscale by: Off (1) and each scale the server compiled, as a radio: a slider over the field's 1 to 4 would
    offer scales no request may use. Without hires scales, Off alone, fixed, and the flag that offers them."""
    shown = row.control
    choices = [("Off", row.default), *((f"×{scale:g}", float(scale)) for scale in scales)]
    info = shown.info if scales else "Off: this server compiled no hires scales (start it with --hires-scales 1.5,2)"
    radio = gr.Radio(
        choices=choices,
        value=row.default,
        label=shown.label,
        info=info,
        interactive=bool(scales),
        elem_id=shown.elem_id,
        **layout,
    )
    # a number, as the API takes it (Gradio describes a radio's values as strings)
    radio.api_info = lambda: {"type": "number", "enum": [value for _, value in choices], "description": row.help}
    return radio


def table_controls(group: str, rules: RequestRules, only: str = "") -> dict[str, Any]:
    """The controls of the table's plain fields in `group`, at this server's defaults; a field the guidance-free
    program does not read is hidden without CFG, the refiner's without a refiner, the hires fix's but its scale
    without hires scales (static). The hires scale is a radio of the server's scales (`hires_scale_control`)."""
    scales = tuple(getattr(rules, "hires_scales", ()))
    controls = {}
    for row in PLAIN:
        if not (row.control and row.control.group == group and (not only or row.name == only)):
            continue
        visible = (
            (rules.cfg or row.without_cfg is None)
            and (row.needs != "refiner" or bool(getattr(rules, "refiner", "")))
            and (row.needs != "hires" or row.name == "hires_scale" or bool(scales))
            and (row.needs not in UNET_EXTRAS or bool(getattr(rules, row.needs, False)))
        )
        if row.name == "hires_scale":
            controls[row.name] = hires_scale_control(row, scales, visible=visible)
        else:
            controls[row.name] = control(
                offered_row(row, rules), getattr(rules, row.rule) if row.rule else row.default, visible=visible
            )
    return controls


def lora_picker(rules: RequestRules) -> tuple:
    """Up to MAX_LORAS rows of (LoRA, weight); hidden when the server offers none."""
    rows = []
    with gr.Group(visible=bool(rules.loras), elem_id="lora-picker"):
        gr.Markdown(f"LoRA: up to {MAX_LORAS} at once (or `<lora:NAME:WEIGHT>` in the prompt)")
        for slot in range(MAX_LORAS):
            with gr.Row(equal_height=True):
                rows.append(
                    gr.Dropdown(
                        choices=[("none", "")] + [(name, name) for name in rules.loras],
                        value="",
                        label=f"LoRA {slot + 1}",
                        show_label=False,
                        scale=3,
                        elem_id=f"lora-{slot + 1}",
                    )
                )
                rows.append(
                    gr.Slider(
                        minimum=-2,
                        maximum=2,
                        value=1,
                        step=0.05,
                        label="Weight",
                        scale=2,
                        elem_id=f"lora-weight-{slot + 1}",
                    )
                )
    return tuple(rows)


def example_buttons(examples: Sequence[str]) -> list[gr.Button]:
    """One button per example prompt (hidden without any)."""
    with gr.Column(visible=bool(examples), elem_id="examples"):
        gr.Markdown("Examples", elem_classes=["examples-label"])
        with gr.Row(elem_classes=["example-buttons"]):
            return [gr.Button(text, size="sm", variant="secondary", elem_classes=["example"]) for text in examples]


# ---- events ----------------------------------------------------------------------------------------------------------


def page_labels(top: PromptRow, fields: Fields) -> dict[str, str]:
    """Each request field's label on the page (field -> its control's label): what the page's refusals call it
    ("Upscale by 3 is not offered ..."), while the API's name it as their callers pass it ("hires_scale 3 ...")."""
    controls = {"prompt": top.prompt, **fields.controls}
    return {name: component.label for name, component in controls.items() if getattr(component, "label", None)}


def wire_generate(
    handlers: Handlers,
    rules: RequestRules,
    top: PromptRow,
    shown: Results,
    fields: Fields,
    concurrency: int = GENERATE_CONCURRENCY,
) -> list:
    """Generate (button, Enter, Vary), the API's /generate and /generate_png, Stop, the PNG follow-up, the picture
    into the mask editor and the LoRA picker into `loras`. Returns the events that end in a generation."""
    inputs = fields.inputs(top.prompt)  # the API's parameters
    answer = [shown.gallery, fields.controls["seed"], shown.status]
    generating = {  # the page's Generate and the API's /generate run one function, in one concurrency group
        "fn": handlers.endpoint(),
        "outputs": answer,
        # Raw payloads go straight to pipeline.contract.request, so the API and the page get the same messages
        # (Gradio's own checks would answer out-of-range values and unknown styles in its own words).
        "preprocess": False,
        "concurrency_limit": concurrency,
        "concurrency_id": "generate",
    }
    page_generating = {  # the page's own: previews; one "step k / N" bar and error badge; its labels in refusals
        **generating,
        "fn": handlers.endpoint(labels=page_labels(top, fields)),  # the API's refusals name a field as it is passed
        "inputs": fields.page_inputs(top.prompt),
        "api_name": "page_generate",
        "api_visibility": "private",
        "show_progress": "full",
        "show_progress_on": [shown.gallery],
    }
    generated, painted = wire_page_generate(top, shown, fields, page_generating)
    wire_api_generate(handlers, rules, shown, fields, inputs, generating)
    picked = wire_picture_in_use(handlers, top, shown, fields)
    varied = wire_vary(handlers, top, shown, fields, picked, page_generating)
    wire_png_follow_up(handlers, shown, [generated, painted, *varied])
    gr.on(
        triggers=[row.change for row in fields.lora_rows],
        fn=handlers.picked_loras,
        inputs=list(fields.lora_rows),
        outputs=fields.controls["loras"],
        queue=False,
        api_visibility="private",
    )
    # Not queued: it must run while this session's generation holds the queue.
    top.stop.click(handlers.stop, inputs=None, outputs=None, queue=False, api_visibility="private")
    wire_png_api(handlers, shown, inputs, answer, concurrency)
    return [generated, painted, *varied]


def wire_plot(handlers: Handlers, xyz: tuple, top: PromptRow, shown: Results, fields: Fields, concurrency: int):
    """ "Run plot" and the API's /xyz_plot: the form's request with the plot's axes (web/page/xyz_panel.py), in the
    generate group, as Generate and /generate are (the page's refusals name its labels; its PNGs follow as a
    generation's do). Returns the page's event."""
    axes, run = xyz
    plotting = {
        "inputs": [*fields.inputs(top.prompt)[:-1], *axes],  # the request fields (no `previews`), then the axes
        "outputs": [shown.gallery, fields.controls["seed"], shown.status],
        "preprocess": False,
        "concurrency_limit": concurrency,
        "concurrency_id": "generate",
    }
    # As Generate does: the last answer's status line goes at once, so a refused plot never sits under an old one.
    run.click(fn=None, js="() => ''", outputs=[shown.status], api_visibility="private")
    plotted = run.click(
        fn=plot_endpoint(handlers, labels=page_labels(top, fields)),
        api_name="page_xyz_plot",
        api_visibility="private",
        show_progress="full",
        show_progress_on=[shown.gallery],
        **plotting,
    )
    shown.api_button.click(  # the hidden button /generate's events are on, which nothing clicks
        fn=plot_endpoint(handlers, streams=False),
        api_name="xyz_plot",
        api_description="An X/Y/Z plot: the grids, then each cell's image; the first cell's seed; a status line.",
        **plotting,
    )
    wire_png_follow_up(handlers, shown, [plotted])
    return plotted


def wire_page_generate(top: PromptRow, shown: Results, fields: Fields, page_generating: dict) -> tuple:
    """The page's Generate: the button and Enter, or (once strokes are painted) its hidden twin that sends the mask
    editor too. Returns both events."""
    # A new request clears the last one's status line at once (in the browser), so a refused request never leaves
    # an older request's "8 images in ..." under its error.
    gr.on(
        triggers=[top.run.click, top.prompt.submit, top.run_painted.click],
        fn=None,
        js="() => ''",
        outputs=[shown.status],
        api_visibility="private",
    )
    generated = gr.on(triggers=[top.run.click, top.prompt.submit], **page_generating)
    # Once strokes are painted (assets/page.js), Generate and Enter press this instead: the mask editor too.
    painted = top.run_painted.click(
        **{
            **page_generating,
            "inputs": fields.page_inputs(top.prompt, painted=True),
            "api_name": "page_generate_painted",
        }
    )
    return generated, painted


def wire_api_generate(
    handlers: Handlers, rules: RequestRules, shown: Results, fields: Fields, inputs: list, generating: dict
) -> None:
    """The API's /generate, on a hidden button, and its plain twin for callers that want no previews."""
    streaming = shown.api_button.click(
        inputs=inputs,
        api_name="generate",
        api_description="One image per accelerator core; returns the images, the seed used and a status line."
        + ("" if rules.cfg else f" Note: {NO_CFG_NOTE}."),
        **generating,
    )
    # /generate with previews=False streams nothing before its answer: a plain function answers it, so a client
    # fetches the images once (web/serving/twin_routing.py). On the same hidden button, which nothing clicks.
    whole = shown.api_button.click(
        inputs=inputs,
        api_name="generate_whole",
        api_visibility="private",
        **{**generating, "fn": handlers.endpoint(streams=False)},
    )
    handlers.twin_routing.add(Twin(event_index(streaming), event_index(whole), inputs.index(fields.previews)))


def wire_picture_in_use(handlers: Handlers, top: PromptRow, shown: Results, fields: Fields) -> gr.State:
    """The picture Generate starts from: an upload, its ✕, and "Use as picture" (the clicked result). Returns the
    State that holds the clicked result's PNG (Vary reads it too)."""
    init_image = fields.controls["init_image"]
    # The picture in use, everywhere it shows: the input, the mask editor (its background; strokes start afresh) and
    # the chip beside Generate.
    in_use = [init_image, fields.picture, top.chip, top.chip_image]
    init_image.change(
        fn=handlers.picture_uploaded,
        inputs=init_image,
        outputs=in_use,
        preprocess=False,
        api_name="picture_uploaded",
        api_visibility="private",
    )
    top.drop.click(
        handlers.drop_picture,
        inputs=None,
        outputs=in_use,
        queue=False,
        api_name="drop_picture",
        api_visibility="private",
    )
    shown.gallery.select(handlers.select, inputs=None, outputs=None, queue=False, api_visibility="private")
    # Vary and "Use as picture" first find the clicked result's PNG into a State, so a refusal (nothing clicked)
    # marks no input with an error badge or a spinner and changes none; what they start follows on success.
    picked = gr.State(None)
    shown.use.click(
        handlers.keep_selected,
        inputs=None,
        outputs=picked,
        api_name="use_picture_pick",
        api_visibility="private",
        show_progress="hidden",
    ).success(
        handlers.use_picture,
        inputs=picked,
        outputs=in_use,
        queue=False,
        api_name="use_picture",
        api_visibility="private",
    )
    return picked


def wire_vary(
    handlers: Handlers, top: PromptRow, shown: Results, fields: Fields, picked: gr.State, page_generating: dict
) -> list:
    """Vary (subtle, strong): the clicked result's PNG into `picked` and a strength, then the page's generation from
    them. Returns the generations."""
    # Vary is one-shot: its generation takes the PNG and strength from the States in place of the picture's inputs,
    # which keep what they held (the next Generate starts from the chip's picture, or from the prompt alone).
    init_image, strength, vary_strength = fields.controls["init_image"], fields.controls["strength"], gr.State(None)
    vary_inputs = [
        picked if item is init_image else vary_strength if item is strength else item
        for item in fields.page_inputs(top.prompt)
    ]
    varied = []
    for button, amount in shown.vary:
        name = button.elem_id.replace("-", "_")  # vary_subtle, vary_strong
        varied.append(
            button.click(
                handlers.vary(amount),
                inputs=None,
                outputs=[picked, vary_strength],
                api_name=f"{name}_pick",
                api_visibility="private",
                show_progress="hidden",
            ).success(**{**page_generating, "inputs": vary_inputs, "api_name": f"page_{name}"})
        )
    return varied


def wire_png_follow_up(handlers: Handlers, shown: Results, answered: list) -> None:
    """The page's follow-up: the lossless PNGs of the images this session was just shown (written in the
    background; matched by file name, so no path a browser sends is ever opened)."""
    for event in answered:
        event.success(
            fn=handlers.pngs,
            inputs=None,
            outputs=shown.pngs,
            api_visibility="private",
            show_progress="hidden",
            concurrency_limit=4,
            concurrency_id="pngs",
        )


def wire_png_api(handlers: Handlers, shown: Results, inputs: list, answer: list, concurrency: int) -> None:
    """The API's /generate_png: /generate's parameters and answer, the images as lossless PNGs."""
    shown.png_api.click(
        fn=handlers.endpoint("png", streams=False),  # no previews: a plain function, its PNGs fetched once
        inputs=inputs,
        outputs=answer,
        api_name="generate_png",
        api_description="The same as /generate, but the images are lossless PNGs with a `parameters` text chunk "
        "(slower to encode and about 8x larger than /generate's JPEGs).",
        preprocess=False,
        concurrency_limit=concurrency,  # a group takes its events' lowest limit: give the same
        concurrency_id="generate",  # shares /generate's slots
    )


def wire_examples(
    handlers: Handlers,
    rules: RequestRules,
    examples: Sequence[str],
    buttons: list,
    top: PromptRow,
    shown: Results,
    fields: Fields,
    concurrency: int = GENERATE_CONCURRENCY,
) -> None:
    """An example (web/page/examples.py): its settings into the form, then its images (kept after its first click) with
    the PNG list of the last request hidden (it no longer matches them). Its seed is fixed: its kept images are
    honest."""
    example_fields = [
        top.prompt,
        *(fields.controls[name] for name in ("negative_prompt", "style", "guidance_scale", "aspect_ratio")),
    ]
    example_seeds = {text: EXAMPLE_SEED_START + i for i, text in enumerate(examples)}
    run_example = handlers.example(example_seeds, EXAMPLE_SEED_START, page_labels(top, fields))
    first_size = size_label(*rules.sizes[0])

    def example_settings(text: str):
        return lambda: (text, "", DEFAULT_STYLE, rules.guidance_scale, first_size)

    for text, button in zip(examples, buttons, strict=True):
        button.click(
            fn=example_settings(text), inputs=None, outputs=example_fields, queue=False, api_visibility="private"
        ).then(
            fn=lambda: gr.update(value=None, visible=False),
            inputs=None,
            outputs=shown.pngs,
            queue=False,
            api_visibility="private",
        ).then(
            fn=run_example,
            inputs=example_fields,
            outputs=[shown.gallery, fields.controls["seed"], shown.status],
            preprocess=False,
            concurrency_limit=concurrency,
            concurrency_id="generate",
            show_progress="full",
            show_progress_on=[shown.gallery],
            api_visibility="private",
        )
