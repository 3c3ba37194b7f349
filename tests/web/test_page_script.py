"""assets/page.js and assets/style.css in Debian's Chromium around the page's own controls (web/page/form.py's sliders,
the History tab's gallery), without an engine: the script and the stylesheet are what they do to those controls, so a
Gradio app of a few of them shows it in seconds where the page around an engine takes minutes to start."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest
from conftest import TIMEOUT_MS, free_port, needs_chromium, set_slider
from PIL import Image

from pipeline.contract.fields import FIELD
from web.history.tab import caption, history_gallery
from web.page.form import control
from web.serving.server import launch

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
    launch(blocks, port=free_port(), prevent_thread_lock=True, quiet=True)  # as the page is launched: its script too
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
        page.wait_for_function(
            "v => document.querySelector('#sent textarea').value === v", arg=sent, timeout=TIMEOUT_MS
        )
        said = "Left empty: set back to the default, {}."
        assert page.locator("#steps .range-note").inner_text() == said.format(STEPS_DEFAULT)
        assert page.locator("#guidance .range-note").inner_text() == said.format(f"{GUIDANCE_DEFAULT:g}")
        page.locator("#steps input[type=number]").fill("1000")  # out of range: set to the nearest limit, and said
        page.locator("#sent textarea").click()
        assert page.locator("#steps .range-note").inner_text() == "1000 is more than 100: set to 100."
        assert page.locator("#steps input[type=range]").input_value() == "100"
    finally:
        page.close()


#: Past generations as the History tab captions them: the longest seed, a long prompt, a short one.
HISTORY = [
    {
        "prompt": "A serious capybara at work, wearing a suit, in an office full of paper, cinematic light",
        "seed": 4294967295,
    },
    {"prompt": "a cat", "seed": 7},
    {"prompt": "a lighthouse at dawn over a calm sea", "seed": 123456},
]


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """The History tab's gallery with the page's stylesheet, three thumbnails captioned as the tab captions them."""
    thumbnail = tmp_path_factory.mktemp("thumbnails") / "thumbnail.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (128, 128, 3), np.uint8)).save(thumbnail)
    with pytest.MonkeyPatch.context() as patch:
        # Gradio copies the thumbnail into its cache when the gallery is made and serves it from there: under
        # tmp_path (the app's own page points the variable at its run folder: web/serving/temp_files.py).
        patch.setenv("GRADIO_TEMP_DIR", str(tmp_path_factory.mktemp("gradio")))
        with gr.Blocks() as blocks:
            history_gallery([(str(thumbnail), caption(settings)) for settings in HISTORY])
        launch(blocks, port=free_port(), prevent_thread_lock=True, quiet=True)  # its stylesheet too
        try:
            yield blocks
        finally:
            blocks.close()


#: Each caption of the history gallery: its text, whether its text overflows its box, and how far the box reaches
#: past its cell (which clips it) and its cell past the grid.
CAPTIONS = """() => [...document.querySelectorAll('#history-gallery .caption-label')].map((label) => {
  const cell = label.closest('.thumbnail-item').getBoundingClientRect(), box = label.getBoundingClientRect();
  return [label.innerText, label.scrollWidth > label.clientWidth || label.scrollHeight > label.clientHeight,
          Math.round(box.bottom - cell.bottom), Math.round(box.right - cell.right)];
})"""


@pytest.mark.parametrize("width", [1280, 390])
def test_history_captions_show_whole_with_the_seed_first(history, browser, width):
    """Issue 68: history captions were cut off (Gradio lays one line over the thumbnail, with an ellipsis: at 150 px
    the prompt's first words, never the seed). Each now shows whole under its thumbnail, on a desktop and a phone."""
    page = browser.new_page(viewport={"width": width, "height": 800})
    try:
        page.goto(history.local_url, timeout=TIMEOUT_MS)
        page.locator("#history-gallery img").nth(len(HISTORY) - 1).wait_for(timeout=TIMEOUT_MS)
        captions = page.evaluate(CAPTIONS)
        assert [text for text, *_ in captions] == [caption(settings) for settings in HISTORY]
        assert captions[0][0].startswith("seed 4294967295 · A serious capybara")
        assert all(not cut and below <= 0 and right <= 0 for _, cut, below, right in captions), captions
    finally:
        page.close()
