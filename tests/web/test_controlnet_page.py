"""ControlNet through the page: the API's `controlnets` (base64 images, never a server path) gives the engine's pixels
and compiles nothing; in the browser, a picture uploaded to the ControlNet panel shows its canny map before anything
is generated, and Generate then runs the control (screenshot: artifacts/browser/controlnet.png); a union ControlNet's
control type is offered and sent only while a union model is chosen.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
from conftest import (
    ARTIFACTS,
    FEATURE_DEVICES,
    FIXTURES,
    TIMEOUT_MS,
    needs_chromium,
    open_advanced,
    open_section,
    page_client,
    served,
)
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.contract.image_files import read_parameters

PICTURE = FIXTURES / "image-input.png"
PROMPT = "a cozy cabin in a snowy forest"


@pytest.fixture(scope="module")
def page(control_engine):
    with served(control_engine) as page:
        yield page


@pytest.fixture(scope="module")
def client(page, tmp_path_factory):
    return page_client(page, tmp_path_factory)


def test_controlnets_through_the_api(client, control_engine):
    before = control_engine.compile_count
    unit = {
        "name": "controlnet-b",
        "image": base64.b64encode(PICTURE.read_bytes()).decode(),
        "weight": 0.9,
        "start": 0.25,
        "preprocessor": "canny",
    }
    gallery, _, _ = client.predict(
        prompt=PROMPT, seed=3, randomize_seed=False, controlnets=[unit], api_name="/generate_png"
    )
    text = read_parameters(gallery[0]["image"])
    assert 'ControlNet 0: "Module: canny, Model: controlnet-b, Weight: 0.9, Guidance Start: 0.25' in text
    request = control_engine.request(PROMPT, seed=3, controlnets=[{**unit, "image": PICTURE}])
    expected = np.asarray(control_engine.generate(request).images[0])
    np.testing.assert_array_equal(np.asarray(Image.open(gallery[0]["image"]).convert("RGB")), expected)
    assert len(gallery) == FEATURE_DEVICES and control_engine.compile_count == before
    with pytest.raises(AppError, match="base64"):  # a path on the server is never read
        client.predict(
            prompt=PROMPT, controlnets=[{"name": "controlnet-a", "image": str(PICTURE)}], api_name="/generate_png"
        )


@pytest.mark.browser
@needs_chromium
def test_the_panel_shows_the_map_before_generating(page, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab = browser.new_page(viewport={"width": 1280, "height": 1600})
    tab.goto(page.local_url)
    open_advanced(tab)
    open_section(tab, "controlnet-settings", "ControlNet", "#control-image")
    tab.locator("#control-image input[type=file]").set_input_files(str(PICTURE))
    shown = tab.locator("#control-map img")
    shown.wait_for(state="visible", timeout=TIMEOUT_MS)
    tab.locator("#controlnet-settings").scroll_into_view_if_needed()
    tab.screenshot(path=str(ARTIFACTS / "controlnet.png"), full_page=True)
    source = shown.get_attribute("src")
    assert source
    tab.locator("#prompt textarea").fill(PROMPT)
    tab.locator("#generate").click()
    tab.wait_for_function("document.querySelectorAll('#gallery img').length === 2", timeout=TIMEOUT_MS)
    tab.wait_for_function(
        "document.querySelector('#status') && /ControlNet|seed/.test(document.body.innerText)", timeout=TIMEOUT_MS
    )
    tab.close()


def test_the_page_panel_sends_the_type_for_a_union_only():
    import gradio as gr

    from pipeline.contract.request import RequestRules
    from web.page.controlnet_panel import control_panel, control_update

    picture = np.asarray(Image.open(PICTURE).convert("RGB"))
    _, (unit,) = control_update(picture, "u", "none", 100, 200, 1.0, 0.0, 1.0, "tile", unions=("u",))
    assert unit["control_type"] == "tile"
    _, (unit,) = control_update(picture, "plain", "none", 100, 200, 1.0, 0.0, 1.0, "tile", unions=("u",))
    assert "control_type" not in unit
    with gr.Blocks() as blocks:
        control_panel(RequestRules(controlnets=("u", "plain"), union_controlnets=("u",)))
    (dropdown,) = [c for c in blocks.blocks.values() if getattr(c, "elem_id", None) == "control-type"]
    assert dropdown.visible and "tile" in [choice[0] for choice in dropdown.choices]
