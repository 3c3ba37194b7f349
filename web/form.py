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
from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipeline.errors import InvalidInput
from pipeline.fields import DEFAULT_CFG_END, DEFAULT_DEEPCACHE
from pipeline.host.plan import SAMPLER_NAMES
from pipeline.request import LORA_TAG, Request
from pipeline.styles import load_styles, unapply_style

from .png_info import FormValues, read_form_values
from .sizes import size_label

#: The settings keys `fill` knows, with what each holds (a history entry has these; an image's, some of them).
SETTINGS_KEYS = (
    "prompt",  # the prompt as typed, with its <lora:...> tags
    "negative_prompt",  # "" for none
    "style",  # a style name of the page
    "seed",  # the request's first seed
    "steps",  # denoising steps asked for
    "sampler",  # the sampler's label (e.g. "DPM++ 2M Karras")
    "guidance_scale",  # CFG scale
    "width",  # pixels
    "height",
    "cfg_end",  # guidance on the first part of the steps (1 = all)
    "deepcache",  # DeepCache's N (1 = off)
    "loras",  # [[name, text-encoder weight, UNet weight], ...]: every LoRA applied (tags and picker)
    "strength",  # denoising strength, when the request started from a picture (None otherwise)
    "picture",  # "image to image", "inpainting" or None: what the request started from (the picture is not kept)
)


def request_settings(request: Request, result: Any) -> dict:
    """A finished request's settings as JSON values (`SETTINGS_KEYS`): what the history keeps of it."""
    height, width = request.size
    picture = None if request.init_image is None else "inpainting" if request.mask_image is not None else \
        "image to image"  # fmt: skip
    return {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "style": request.style,
        "seed": int(request.seed),
        "steps": int(request.steps),
        "sampler": str(result.sampler),
        "guidance_scale": float(request.guidance_scale),
        "width": int(width),
        "height": int(height),
        "cfg_end": float(request.cfg_end),
        "deepcache": int(request.deepcache),
        "loras": [[name, float(te), float(unet)] for name, te, unet in request.loras],
        "strength": None if picture is None else float(request.strength),
        "picture": picture,
    }


def image_settings(values: FormValues) -> tuple[dict, list[str]]:
    """An image's `parameters` (parsed by web/png_info.py) as settings keys, with notes on what was left out.

    A1111 writes every LoRA as a tag in the prompt, so the prompt brings them back (and the picker is cleared);
    A1111's prompt is styled already (style "No style"); this app's names its style, whose words are taken out.
    """
    settings: dict[str, Any] = {"prompt": values.prompt, "negative_prompt": values.negative_prompt, "style": None,
                                "loras": []}  # fmt: skip
    for key, value in (("steps", values.steps), ("sampler", values.sampler), ("guidance_scale", values.guidance_scale),
                       ("seed", values.seed), ("width", values.width), ("height", values.height)):  # fmt: skip
        if value is not None:
            settings[key] = value
    # This app's images name their style ("Style: Cinematic") after the styled prompt: the box gets the user's words.
    style_name = values.extra.get("Style")
    template = load_styles().get(style_name) if isinstance(style_name, str) else None
    if template is not None and (typed := unapply_style(template, values.prompt, values.negative_prompt)):
        settings.update(prompt=typed[0], negative_prompt=typed[1], style=style_name)
    # This app writes the speed levers only when they are not off, and A1111 has none: absent means off.
    settings.update(cfg_end=DEFAULT_CFG_END, deepcache=DEFAULT_DEEPCACHE)
    for key, name in (("cfg_end", "CFG end"), ("deepcache", "DeepCache"), ("strength", "Denoising strength")):
        value = values.extra.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            settings[key] = value
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):  # not a number: the field stays as it is
                settings[key] = float(value)
    return settings, list(values.notes)


@dataclass(frozen=True)
class Form:
    """The page's form fields that settings fill, in the order `fill` answers them."""

    prompt: gr.Textbox
    negative: gr.Textbox
    style: gr.Dropdown
    guidance: gr.Slider
    seed: gr.Number
    randomize: gr.Checkbox
    aspect: gr.Dropdown
    steps: gr.Slider
    sampler: gr.Dropdown
    cfg_end: gr.Slider
    deepcache: gr.Slider
    lora_rows: tuple  # name, weight, name, weight, ... (MAX_LORAS pairs)
    strength: gr.Slider
    styles: tuple[str, ...]  # the page's style names
    sizes: tuple[tuple[int, int], ...]  # the offered (height, width)
    samplers: tuple[str, ...]  # the offered sampler labels
    loras: tuple[str, ...]  # the server's LoRA names

    @property
    def fields(self) -> list:
        """The components `fill`'s updates are for, in order (an event's outputs)."""
        return [self.prompt, self.negative, self.style, self.guidance, self.seed, self.randomize, self.aspect,
                self.steps, self.sampler, self.cfg_end, self.deepcache, *self.lora_rows, self.strength]  # fmt: skip

    def fill(self, settings: Mapping[str, Any]) -> tuple[list, list[str]]:
        """One update per field of `fields` (gr.skip() where `settings` says nothing usable), and one sentence per
        setting that could not be used here (a size not offered, a LoRA this server does not have, ...)."""
        notes: list[str] = []
        get = settings.get

        def text(key):
            value = get(key)
            return gr.update(value=value) if isinstance(value, str) else gr.skip()

        def number(key, low, high, kind=float):
            value = get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return gr.skip()
            if not low <= value <= high:
                notes.append(f"{key.replace('_', ' ').capitalize()} {value:g} is outside {low:g} to {high:g}, so it "
                             "was left as it is.")  # fmt: skip
                return gr.skip()
            return gr.update(value=kind(value))

        style = get("style")
        if style is None and "style" in settings:  # an image's prompt already holds its style's words
            style_update = gr.update(value=self.styles[0]) if self.styles else gr.skip()
        elif isinstance(style, str) and style in self.styles:
            style_update = gr.update(value=style)
        else:
            style_update = gr.skip()
            if style is not None:
                notes.append(f"The style {style!r} is not offered here, so the style was left as it is.")
        seed = number("seed", 0, 2**32 - 1, int)
        size, height, width = gr.skip(), get("height"), get("width")
        if isinstance(height, int) and isinstance(width, int):
            if (height, width) in self.sizes:
                size = gr.update(value=size_label(height, width))
            else:
                notes.append(f"The size {width}×{height} is not offered here, so the size was left as it is.")
        sampler = get("sampler")
        sampler_update = gr.update(value=sampler) if sampler in self.samplers else gr.skip()
        if isinstance(sampler, str) and sampler not in self.samplers:
            notes.append(f"The sampler {sampler!r} is not offered here, so the sampler was left as it is.")
        return [
            text("prompt"),
            text("negative_prompt"),
            style_update,
            number("guidance_scale", 0, 20),
            seed,
            gr.update(value=False) if "value" in seed else gr.skip(),  # a seed read back is meant to be used
            size,
            number("steps", 1, 100, int),
            sampler_update,
            number("cfg_end", 0.05, 1),
            number("deepcache", 1, 10, int),
            *self._lora_rows(settings, notes),
            number("strength", 0.05, 1),
        ], notes

    def from_image(self, path: str | None) -> list:
        """PNG Info: the form filled from a dropped image's `parameters` (this app's, A1111's, ComfyUI's A1111-style),
        and the drop box cleared; one sentence when the file holds none."""
        if not path:
            return [gr.skip()] * (len(self.fields) + 1)
        try:
            offered = {label: SAMPLER_NAMES.get(label, label) for label in self.samplers}
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
                notes.append(f"The prompt's LoRA {name!r} is not offered here; remove its <lora:…> tag before "
                             "Generate.")  # fmt: skip
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

