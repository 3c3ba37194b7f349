"""The page's Outpaint choice: beside image to image, the directions to grow the picture, the pixels, and the canvas.

The panel keeps the API's `outpaint` value (a hidden textbox, "left=128 right=128") in step with its controls and
shows the grown canvas the engine will inpaint (`pipeline.contract.outpaint.grown`: the picture fitted into the
chosen size less the new border, the border filled with its edge colours) as soon as the picture, a direction, the
pixels or the size change: what the request checks again when it is sent.
"""

from __future__ import annotations

import gradio as gr
import numpy as np

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD, check_size
from pipeline.contract.image_inputs import open_image, to_rgb
from pipeline.contract.outpaint import Sides, check_room, grown, read_sides
from pipeline.contract.request import RequestRules

from .handlers import file_path

#: The panel's choices: start from the picture as it is, or grow it.
MODES = ("Image to image", "Outpaint")
#: The directions, as the boxes name them.
DIRECTIONS = ("left", "right", "up", "down")


def outpaint_text(mode: str, directions: list[str] | None, pixels: float) -> str:
    """The API's `outpaint` for the panel's values ("" unless Outpaint with a direction)."""
    if mode != MODES[1] or not directions:
        return ""
    return Sides(**{side: int(pixels) for side in DIRECTIONS if side in directions}).text


def canvas(path: str | None, text: str, size: str, rules: RequestRules) -> np.ndarray | None:
    """The grown canvas for the picture at `path` (uint8 [H, W, 3]), or None: no picture, no outpaint, or one that
    leaves no room (a warning says the sentence the request would get)."""
    if path is None or not text:
        return None
    try:
        height, width = check_size(size, rules.sizes)
        sides = read_sides(text)
        check_room(sides, height, width, rules.sizes)
        picture = to_rgb(open_image(path, what="image"))
    except InvalidInput as exc:
        gr.Warning(str(exc), title="Outpaint")
        return None
    return grown(picture, sides, height, width, FIELD["mask_blur"].default)[0]


def outpaint_panel(rules: RequestRules, picture: gr.Image, size: gr.Dropdown) -> gr.Textbox:
    """The panel under the picture; returns the API's `outpaint` component (hidden)."""
    value = gr.Textbox(value="", visible=False, label="outpaint")
    mode = gr.Radio(list(MODES), value=MODES[0], label="Start from the picture as", elem_id="picture-mode")
    with gr.Row(equal_height=True, visible=False, elem_id="outpaint-settings") as row:
        directions = gr.CheckboxGroup(
            list(DIRECTIONS),
            value=["left", "right"],
            label="Grow towards",
            info="The size chosen above is the grown canvas; the picture is fitted into the rest",
            elem_id="outpaint-directions",
        )
        pixels = gr.Slider(8, 512, 64, step=8, label="Pixels", elem_id="outpaint-pixels")
        shown = gr.Image(label="The grown canvas", interactive=False, elem_id="outpaint-canvas")
    mode.change(
        lambda chosen: gr.update(visible=chosen == MODES[1]),
        inputs=mode,
        outputs=row,
        queue=False,
        api_visibility="private",
    )
    for component in (mode, directions, pixels):
        component.change(
            outpaint_text, inputs=[mode, directions, pixels], outputs=value, queue=False, api_visibility="private"
        )
    for component in (value, picture, size):
        component.change(
            lambda upload, text, chosen: canvas(file_path(upload), text, chosen, rules),
            inputs=[picture, value, size],
            outputs=shown,
            queue=False,
            preprocess=False,  # the upload as sent: Gradio's own decoding of a non-picture is a long traceback
            api_visibility="private",
        )
    return value
