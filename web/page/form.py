"""The generation form as settings: what a finished request's settings are, and the form filled back from them.

Two features hand settings back to the form: the History tab ("Use these settings") and PNG Info (an image's
`parameters`). Both go through `Form.fill`, so both fill the same fields the same way.

    settings = request_settings(request, result)          # what the history keeps: JSON values, one level deep
    updates = form.fill(settings)                          # gr.update per form field; a missing key leaves its field
    settings, notes = image_settings(read_form_values(path, SAMPLER_NAMES))   # an image's, as the same keys
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import gradio as gr

from pipeline.contract.engine import EngineResult
from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD, FIELDS, PLAIN, Field
from pipeline.contract.request import LORA_TAG, UNET_EXTRAS, Request
from pipeline.contract.sampler_names import SAMPLER_NAMES
from pipeline.contract.styles import load_styles, unapply_style

from .png_info import FormValues, read_form_values
from .size_labels import size_label

#: The settings keys `fill` knows besides the table's plain fields (`pipeline.contract.fields.PLAIN`, by name).
OWN_KEYS = (
    "prompt",  # the prompt as typed, with its <lora:...> tags
    "negative_prompt",  # "" for none
    "style",  # a style name of the page
    "seed",  # the request's first seed
    "width",  # pixels
    "height",
    "loras",  # [[name, text-encoder weight, UNET weight], ...]: every LoRA applied (tags and picker)
    "picture",  # "image to image", "inpainting" or None: what the request started from (the picture is not kept)
    "regions",  # Regional Prompter's divide syntax ("": none, or a painted mask, which is not kept)
)
#: Every settings key: a history entry has these; an image's, some of them.
SETTINGS_KEYS = (*OWN_KEYS, *(row.name for row in PLAIN))


def request_settings(request: Request, result: EngineResult) -> dict:
    """A finished request's settings as JSON values (`SETTINGS_KEYS`): what the history keeps of it. The sampler is
    the one that ran; a field that counts with a picture only is None without one."""
    height, width = request.size
    picture = (
        None if request.init_image is None else "inpainting" if request.mask_image is not None else "image to image"
    )
    plain = {
        row.name: None if row.needs == "picture" and picture is None else _json(getattr(request, row.name))
        for row in PLAIN
    }
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "style": request.style,
        "seed": int(request.seed),
        "width": int(width),
        "height": int(height),
        "loras": [[name, float(te), float(unet)] for name, te, unet in request.loras],
        "picture": picture,
        "regions": request.regions,
        **plain,
        "sampler": str(result.sampler),
    }


def _json(value: Any) -> Any:
    """A plain field's value as JSON has it (numpy scalars included)."""
    return value if value is None or isinstance(value, str) else value.item() if hasattr(value, "item") else value


def image_settings(values: FormValues) -> tuple[dict, list[str]]:
    """An image's `parameters` (parsed by web/page/png_info.py) as settings keys, with notes on what was left out.

    A1111 writes every LoRA as a tag in the prompt, so the prompt brings them back (and the picker is cleared);
    A1111's prompt is styled already (style "No style"); this app's names its style, whose words are taken out.
    A1111's basics are the parsed values' own; this app writes the table's other fields only when they are not at
    their default (and A1111 has none): absent means the default, except a picture's (absent: left as it is).
    """
    settings: dict[str, Any] = {
        "prompt": values.prompt,
        "negative_prompt": values.negative_prompt,
        "style": None,
        "loras": [],
    }
    for key in ("seed", "width", "height"):
        if getattr(values, key) is not None:
            settings[key] = getattr(values, key)
    # This app's images name their style ("Style: Cinematic") after the styled prompt: the box gets the user's words.
    style_name = values.extra.get("Style")
    template = load_styles().get(style_name) if isinstance(style_name, str) else None
    if template is not None and (typed := unapply_style(template, values.prompt, values.negative_prompt)):
        settings.update(prompt=typed[0], negative_prompt=typed[1], style=style_name)
    mode, ratios = values.extra.get("RP Divide mode"), values.extra.get("RP Ratios")  # Regional Prompter's
    regional = values.extra.get("RP Active") in (True, "True") and mode in ("Columns", "Rows")
    settings["regions"] = f"{mode.lower()} {ratios}" if regional and isinstance(ratios, str) else ""
    hires = "Hires upscale" in values.extra  # A1111's txt2img hires fix: its Denoising strength is the second pass's
    for row in PLAIN:
        if not row.label:
            continue
        value = getattr(values, row.name, None) if row.basic else values.extra.get(row.label)
        if (row.needs == "hires" and not hires) or (
            row.needs == "picture" and hires and row.label == "Denoising strength"
        ):
            value = None  # the hires fix off (its fields at their defaults), or the strength was the hires fix's
        if isinstance(value, str) and not row.textual:
            with contextlib.suppress(ValueError):  # not a number: the field stays as it is
                value = float(value)
        if value is None or isinstance(value, bool) or (isinstance(value, str) != row.textual):
            if not row.basic and row.needs != "picture":
                settings[row.name] = row.default
            continue
        settings[row.name] = value if row.textual else row.from_label(value)  # A1111's numbering off
    return settings, list(values.notes)


@dataclass(frozen=True)
class Form:
    """The page's form fields that settings fill, and what the page offers."""

    controls: Mapping[str, Any]  # the request fields' components by table name (`pipeline.contract.fields.FIELDS`)
    lora_rows: tuple  # name, weight, name, weight, ... (MAX_LORAS pairs)
    styles: tuple[str, ...]  # the page's style names
    sizes: tuple[tuple[int, int], ...]  # the offered (height, width)
    loras: tuple[str, ...]  # the server's LoRA names
    refiner: str = ""  # the server's refiner ("": none, so the refiner's fields stay at their defaults)
    hires_scales: tuple[float, ...] = ()  # the server's hires scales (none: the hires fix's fields stay as they are)
    extras: tuple[str, ...] = ()  # "pag", "freeu": what the server compiled (--pag, --freeu-programs); else as they are

    @property
    def filled(self) -> list[str]:
        """The table names of the controls `fill` answers, in the table's order (the LoRA picker's rows for loras)."""
        return [row.name for row in FIELDS if row.name in self.controls or row.name == "loras"]

    @property
    def fields(self) -> list:
        """The components `fill`'s updates are for, in order (an event's outputs)."""
        return [item for name in self.filled for item in (self.lora_rows if name == "loras" else [self.controls[name]])]

    def fill(self, settings: Mapping[str, Any]) -> tuple[list, list[str]]:
        """One update per field of `fields` (gr.skip() where `settings` says nothing usable), and one sentence per
        setting that could not be used here (a size not offered, a LoRA this server does not have, ...)."""
        notes: list[str] = []
        updates = {
            row.name: _fill_plain(row, settings.get(row.name), notes)
            for row in PLAIN
            if (row.needs != "refiner" or self.refiner)
            and (row.needs != "hires" or self.hires_scales)
            and (row.needs not in UNET_EXTRAS or row.needs in self.extras)
        }
        for row in PLAIN:  # likewise the hires fix without hires scales
            if row.needs == "hires" and not self.hires_scales:
                updates[row.name] = gr.skip()
                if row.name == "hires_scale" and settings.get(row.name) not in (None, row.default):
                    notes.append(f"This server has no hires fix, so Hires upscale {settings[row.name]:g} was left out.")
        scale = settings.get("hires_scale")  # Upscale by offers the server's scales only (layout.hires_scale_control)
        if self.hires_scales and "value" in updates["hires_scale"] and scale not in (1.0, *self.hires_scales):
            updates["hires_scale"] = gr.skip()
            offered = ", ".join(f"{s:g}" for s in self.hires_scales)
            notes.append(
                f"Hires upscale {scale:g} is not offered here (Upscale by: 1 or {offered}), so Upscale by "
                "was left as it is."
            )
        for row in PLAIN:  # Generate would refuse a refiner's switch without one: say so now, keep the default
            if row.needs == "refiner" and not self.refiner:
                updates[row.name] = gr.skip()
                if row.name == "refiner_switch" and settings.get(row.name) not in (None, row.default):
                    notes.append(f"This server has no refiner, so {row.label} {settings[row.name]:g} was left out.")
        for row in PLAIN:  # PAG and FreeU without their programs: Generate would refuse them too
            if row.needs in UNET_EXTRAS and row.needs not in self.extras:
                updates[row.name] = gr.skip()
                if row.status and (value := settings.get(row.name)) not in (None, row.default):
                    shown = value if row.textual else f"{value:g}"
                    notes.append(f"This server does not offer {row.status}, so {row.label} {shown} was left out.")
        updates.update(
            prompt=_text(settings.get("prompt")),
            negative_prompt=_text(settings.get("negative_prompt")),
            style=self._style(settings, notes),
            aspect_ratio=self._size(settings, notes),
        )
        seed = FIELD["seed"]
        updates["seed"] = _fill_plain(replace(seed, kind="int"), settings.get("seed"), notes)
        updates["randomize_seed"] = gr.update(value=False) if "value" in updates["seed"] else gr.skip()  # to be used
        updates["loras"] = self._lora_rows(settings, notes)
        updates["regions"] = _text(settings.get("regions"))
        return [item for name in self.filled for item in (updates[name] if name == "loras" else [updates[name]])], notes

    def _style(self, settings: Mapping[str, Any], notes: list[str]):
        style = settings.get("style")
        if style is None and "style" in settings:  # an image's prompt already holds its style's words
            return gr.update(value=self.styles[0]) if self.styles else gr.skip()
        if isinstance(style, str) and style in self.styles:
            return gr.update(value=style)
        if style is not None:
            notes.append(f"The style {style!r} is not offered here, so the style was left as it is.")
        return gr.skip()

    def _size(self, settings: Mapping[str, Any], notes: list[str]):
        height, width = settings.get("height"), settings.get("width")
        if not (isinstance(height, int) and isinstance(width, int)):
            return gr.skip()
        if (height, width) in self.sizes:
            return gr.update(value=size_label(height, width))
        notes.append(f"The size {width}×{height} is not offered here, so the size was left as it is.")
        return gr.skip()

    def from_image(self, path: str | None) -> list:
        """PNG Info: the form filled from a dropped image's `parameters` (this app's, A1111's, ComfyUI's A1111-style),
        and the drop box cleared; one sentence when the file holds none."""
        if not path:
            return [gr.skip()] * (len(self.fields) + 1)
        try:
            offered = {label: SAMPLER_NAMES.get(label, label) for label in FIELD["sampler"].choices}
            values = read_form_values(path, offered_samplers=offered)
        except InvalidInput as exc:
            raise gr.Error(str(exc), title="No settings in this image", print_exception=False) from None
        settings, notes = image_settings(values)
        updates, more = self.fill(settings)
        for note in [*notes, *more]:
            gr.Warning(note)
        return [*updates, gr.update(value=None)]

    def _lora_rows(self, settings: Mapping[str, Any], notes: list[str]) -> list:
        """The picker's rows: the LoRAs not already tagged in the prompt; cleared for an image (its tags are)."""
        if "loras" not in settings:
            return [gr.skip()] * len(self.lora_rows)
        prompt = settings.get("prompt") if isinstance(settings.get("prompt"), str) else ""
        tagged = {match.group(1).strip().lower() for match in LORA_TAG.finditer(prompt)}
        offered = {name.lower() for name in self.loras}
        for name in sorted({match.group(1).strip() for match in LORA_TAG.finditer(prompt)}):
            if name.lower() not in offered:  # Generate would refuse it: say it now, as for a sampler or a size
                notes.append(
                    f"The prompt's LoRA {name!r} is not offered here; remove its <lora:…> tag before Generate."
                )
        picked = []
        for item in settings.get("loras") or []:
            if not (isinstance(item, list | tuple) and len(item) >= 2 and isinstance(item[0], str)):
                continue
            name, weight = item[0], item[1]
            if name.lower() in tagged:
                continue
            if name not in self.loras:
                notes.append(f"The LoRA {name!r} is not on this server, so it was left out.")
                continue
            picked.append((name, weight))
        rows = []
        for slot in range(len(self.lora_rows) // 2):
            name, weight = picked[slot] if slot < len(picked) else ("", 1)
            rows += [gr.update(value=name), gr.update(value=weight)]
        return rows


def lowest(row: Field) -> float | None:
    """The lowest value a number's control offers: its low bound, or a slider step above it when it is excluded
    (None for a choice)."""
    if row.low is None:
        return None
    return row.low + (row.control.step if row.above and row.control else 0)


def control(row: Field, value: object, **layout) -> gr.Slider | gr.Dropdown | gr.Textbox:
    """A plain field's control as the table says: a slider over its bounds (its typed numbers checked by
    assets/page.js: class "bounded"), a dropdown of its choices, or a text box of its factors."""
    shown = row.control
    info = shown.info.format(low=lowest(row), high=row.high) or None
    if row.kind == "factors":
        return gr.Textbox(value=value, label=shown.label, info=info, elem_id=shown.elem_id, max_lines=1, **layout)
    if row.kind == "choice":
        return gr.Dropdown(
            choices=list(row.choices),
            value=value,
            label=shown.label,
            info=info,
            allow_custom_value=False,
            elem_id=shown.elem_id,
            **layout,
        )
    return gr.Slider(
        minimum=lowest(row),
        maximum=row.high,
        value=value,
        step=shown.step,
        label=shown.label,
        info=info,
        elem_id=shown.elem_id,
        elem_classes=["bounded"],
        **layout,
    )


def _text(value: object):
    return gr.update(value=value) if isinstance(value, str) else gr.skip()


def _fill_plain(row: Field, value: object, notes: list[str]):
    """The update of a plain field's control from a setting: skipped (with a note) when the page cannot show it."""
    if row.kind == "factors":
        return gr.update(value=value) if isinstance(value, str) else gr.skip()
    if row.kind == "choice":
        if isinstance(value, str) and value not in row.choices:
            notes.append(f"The {row.called} {value!r} is not offered here, so the {row.called} was left as it is.")
        return gr.update(value=value) if value in row.choices else gr.skip()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return gr.skip()
    if not lowest(row) <= value <= row.high:
        called = row.control.label if row.control else row.name.replace("_", " ").capitalize()  # as the page says it
        notes.append(f"{called} {value:g} is outside {lowest(row):g} to {row.high:g}, so it was left as it is.")
        return gr.skip()
    return gr.update(value=int(value) if row.kind == "int" else float(value))
