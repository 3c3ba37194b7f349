"""assets/page.js in Debian's Chromium around the page's own slider controls (web/form.py: `control`), without an
engine: the script is what it does to those controls, so a Gradio app of two sliders and a button shows it in
seconds where the page around an engine takes minutes to start."""

from __future__ import annotations

import gradio as gr
import pytest
from conftest import TIMEOUT_MS, free_port, needs_chromium, set_slider

from pipeline.contract.fields import FIELD
from web.form import control
from web.texts import PAGE_JS

pytestmark = [pytest.mark.browser, needs_chromium]

STEPS_DEFAULT = 25
GUIDANCE_DEFAULT = 5.0


@pytest.fixture(scope="module")
def sliders():
    """Steps and guidance as the page makes them, and a button that shows the values an event would send."""
    with gr.Blocks() as blocks:
        steps = control(FIELD["steps"], STEPS_DEFAULT)
        guidance = control(FIELD["guidance_scale"], GUIDANCE_DEFAULT)
        sent = gr.Textbox(elem_id="sent", interactive=True)  # also where the tests move the focus to
        gr.Button("Send", elem_id="send").click(lambda s, g: f"{s:g} {g:g}", [steps, guidance], sent)
    blocks.launch(server_port=free_port(), prevent_thread_lock=True, quiet=True, ssr_mode=False,
                  js=PAGE_JS.read_text(encoding="utf-8"))  # as web/server.py launches the page
    try:
        yield blocks
    finally:
        blocks.close()


def test_an_emptied_slider_box_goes_back_to_its_default_and_says_so(sliders, browser):
    """Issue 68: an emptied Steps box ran 1 step, silently (Gradio sets an empty box to the lowest value). Now the
    box goes back to the slider's default, as the API takes a field left out, and the line under it says so."""
    page = browser.new_page()
    try:
        page.goto(sliders.local_url, timeout=TIMEOUT_MS)
        set_slider(page, "steps", 7)
        set_slider(page, "guidance", 2)
        for elem_id in ("steps", "guidance"):
            page.locator(f"#{elem_id} input[type=number]").fill("")
            page.locator("#sent textarea").click()  # the box loses focus, as when the user goes on to Generate
        page.locator("#send").click()
        sent = f"{STEPS_DEFAULT} {GUIDANCE_DEFAULT:g}"
        page.wait_for_function("v => document.querySelector('#sent textarea').value === v", arg=sent,
                               timeout=TIMEOUT_MS)  # fmt: skip
        said = "Left empty: set back to the default, {}."
        assert page.locator("#steps .range-note").inner_text() == said.format(STEPS_DEFAULT)
        assert page.locator("#guidance .range-note").inner_text() == said.format(f"{GUIDANCE_DEFAULT:g}")
        page.locator("#steps input[type=number]").fill("1000")  # out of range: set to the nearest limit, and said
        page.locator("#sent textarea").click()
        assert page.locator("#steps .range-note").inner_text() == "1000 is more than 100: set to 100."
        assert page.locator("#steps input[type=range]").input_value() == "100"
    finally:
        page.close()
