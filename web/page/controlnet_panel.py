"""The page's ControlNet panel: a picture, the preprocessor's map shown before generating, weight and range sliders,
and a union ControlNet's control type (shown only while a union model is chosen).

The panel keeps the API's `controlnets` value (a hidden JSON component, one unit, the picture as base64 PNG) in step
with its controls, and shows the map the ControlNet will see (canny's edges, or the picture itself with "none") as
soon as a picture or a threshold changes: what the request checks again (`pipeline.contract.controlnet_units`) when
it is sent.
"""

from __future__ import annotations

import base64
import functools
import io

import gradio as gr
import numpy as np
from PIL import Image

from pipeline.contract.controlnet_units import (
    CANNY_HIGH,
    CANNY_LOW,
    CONTROL_TYPES,
    PREPROCESSORS,
    TILE_MAX_RATE,
    TILE_RATE,
    preprocess,
)
from pipeline.contract.request import RequestRules


def control_update(picture, name, module, low, high, weight, start, end, control_type="", rate=TILE_RATE, unions=()):
    """(the map shown, the API's `controlnets`) for the panel's values; no picture: nothing shown, no unit. The
    control type goes with a union model (`unions`) only."""
    if picture is None or not name:
        return None, []
    pixels = np.asarray(Image.fromarray(np.asarray(picture)).convert("RGB"))  # uint8 [H, W, 3]
    shown = preprocess(pixels, module, int(low), int(high), float(rate))
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    unit = {
        "name": name,
        "image": base64.b64encode(buffer.getvalue()).decode("ascii"),
        "weight": float(weight),
        "start": float(start),
        "end": float(end),
        "preprocessor": module,
        "low": int(low),
        "high": int(high),
        "rate": float(rate),
    }
    if name in unions:
        unit["control_type"] = control_type
    return shown, [unit]


def control_panel(rules: RequestRules) -> gr.JSON:
    """The panel (hidden when the server has no ControlNet); returns the API's `controlnets` component."""
    offered = list(rules.controlnets)
    value = gr.JSON(value=[], visible=False, label="controlnets")
    # described as a list: a schema-checking client (MCP's) rejects the "any type" a JSON component says it takes
    value.api_info = lambda: {
        "type": "array",
        "items": {"type": "object"},
        "description": "[{name, image (base64 PNG), weight, start, end, preprocessor, rate, control_type}, ...]",
    }
    with gr.Accordion("ControlNet", open=False, visible=bool(offered), elem_id="controlnet-settings"):
        with gr.Row(equal_height=True):
            picture = gr.Image(
                label="Control picture (upload or paste)",
                type="numpy",
                sources=["upload", "clipboard"],
                elem_id="control-image",
            )
            shown = gr.Image(label="What the ControlNet sees", interactive=False, elem_id="control-map")
        with gr.Row(equal_height=True):
            name = gr.Dropdown(
                choices=offered, value=offered[0] if offered else None, label="ControlNet", elem_id="control-name"
            )
            module = gr.Dropdown(
                choices=list(PREPROCESSORS),
                value="canny",
                label="Preprocessor",
                info="canny: the picture's edges; tile: a blurred copy; none: the picture is the map",
                elem_id="control-module",
            )
            low = gr.Slider(1, 255, CANNY_LOW, step=1, label="Canny low threshold", elem_id="control-low")
            high = gr.Slider(1, 255, CANNY_HIGH, step=1, label="Canny high threshold", elem_id="control-high")
            rate = gr.Slider(
                TILE_RATE, TILE_MAX_RATE, TILE_RATE, step=0.5, label="Tile down-sampling rate", elem_id="control-rate"
            )
        with gr.Row(equal_height=True):
            weight = gr.Slider(0, 2, 1, step=0.05, label="Control weight", elem_id="control-weight")
            start = gr.Slider(0, 1, 0, step=0.05, label="Starting control step", elem_id="control-start")
            end = gr.Slider(0, 1, 1, step=0.05, label="Ending control step", elem_id="control-end")
            unions = tuple(rules.union_controlnets)
            control_type = gr.Dropdown(
                choices=list(CONTROL_TYPES),
                value="canny",
                label="Control type",
                info="a union ControlNet's (ProMax) condition: what the map shows",
                visible=bool(offered) and offered[0] in unions,
                elem_id="control-type",
            )
    inputs = [picture, name, module, low, high, weight, start, end, control_type, rate]
    update = functools.partial(control_update, unions=unions)
    for component in inputs:
        component.change(update, inputs=inputs, outputs=[shown, value], queue=False, api_visibility="private")
    name.change(
        lambda chosen: gr.update(visible=chosen in unions), name, control_type, queue=False, api_visibility="private"
    )
    return value
