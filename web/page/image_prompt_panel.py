"""The page's "Image prompt" panel (IP-Adapter): a few pictures, each with its adapter, weight and step range, as
Fooocus' Image Prompt tab and Forge's IP-Adapter units offer them.

The panel keeps the API's `ip_images` value (a hidden JSON component: one item per picture given, the picture as
base64 PNG) in step with its controls; the request checks it again (`pipeline.contract.image_prompts`) when sent.
"""

from __future__ import annotations

import base64
import io

import gradio as gr
import numpy as np
from PIL import Image

from pipeline.contract.image_prompts import DEFAULT_SCALE, MAX_SCALE
from pipeline.contract.request import RequestRules

#: Each slot's controls, in the order `prompts_of` reads them.
PER_SLOT = ("image", "adapter", "scale", "start", "end")


def prompts_of(*values) -> list[dict]:
    """The API's `ip_images` for the panel's values (each slot's picture, adapter, scale, start, end): the slots with
    a picture, in order."""
    prompts = []
    for index in range(0, len(values), len(PER_SLOT)):
        picture, adapter, scale, start, end = values[index : index + len(PER_SLOT)]
        if picture is None or not adapter:
            continue
        buffer = io.BytesIO()
        Image.fromarray(np.asarray(picture)).convert("RGB").save(buffer, format="PNG", compress_level=1)
        prompts.append(
            {
                "image": base64.b64encode(buffer.getvalue()).decode("ascii"),
                "adapter": adapter,
                "scale": float(scale),
                "start": float(start),
                "end": float(end),
            }
        )
    return prompts


def image_prompt_panel(rules: RequestRules) -> gr.JSON:
    """The panel (hidden when the server has no IP-Adapter); returns the API's `ip_images` component."""
    offered = list(rules.ip_adapters)
    value = gr.JSON(value=[], visible=False, label="ip_images")
    # described as a list: a schema-checking client (MCP's) rejects the "any type" a JSON component says it takes
    value.api_info = lambda: {
        "type": "array",
        "items": {"type": "object"},
        "description": "[{image (base64 PNG), adapter, scale 0..2, start, end}, ...] (IP-Adapter image prompts)",
    }
    inputs = []
    accordion = gr.Accordion("Image prompt", open=False, visible=bool(offered), elem_id="image-prompt-settings")
    with accordion, gr.Row(equal_height=True):
        for slot in range(rules.ip_slots if offered else 0):
            with gr.Column(min_width=200):
                inputs += [
                    gr.Image(
                        label=f"Image prompt {slot + 1}",
                        type="numpy",
                        sources=["upload", "clipboard"],
                        elem_id=f"ip-image-{slot}",
                    ),
                    gr.Dropdown(
                        choices=offered,
                        value=offered[0],
                        label="IP-Adapter",
                        visible=len(offered) > 1,
                        elem_id=f"ip-adapter-{slot}",
                    ),
                    gr.Slider(0, MAX_SCALE, DEFAULT_SCALE, step=0.05, label="Weight", elem_id=f"ip-scale-{slot}"),
                    gr.Slider(0, 1, 0, step=0.05, label="Start at", elem_id=f"ip-start-{slot}"),
                    gr.Slider(0, 1, 1, step=0.05, label="End at", elem_id=f"ip-end-{slot}"),
                ]
    for component in inputs:
        component.change(prompts_of, inputs=inputs, outputs=value, queue=False, api_visibility="private")
    return value
