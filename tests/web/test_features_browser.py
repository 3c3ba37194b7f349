"""The features' controls in a real browser (Debian's Chromium via Playwright), around the feature engine (tiny-pt on
2 devices with the fixture LoRAs and the speed levers): the LoRA picker and the speed sliders reach the request; a
picture uploaded into #init-image, a stroke painted with the mask editor's brush, Generate: inpainted; a gallery image,
Vary (strong): a picture at strength 0.85, once (issue 68: the next Generate draws from the prompt); "Use as picture"
and an upload show the picture beside Generate, whose ✕ drops it; a refused Vary leaves the picture as it was.

The mask editor is a PixiJS canvas that headless Chromium renders slowly: waits are generous. Screenshots go to
artifacts/browser/ (git-ignored): features-levers.png, features-inpainted.png, features-vary.png,
features-picture-chip.png, features-refused-vary.png.
"""

from __future__ import annotations

import time

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
    served,
    set_steps,
)
from PIL import Image

playwright_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, needs_chromium]

PICTURE = FIXTURES / "image-input.png"
#: The page error of Svelte's effect loop guard: the page's script has gone round in circles.
EFFECT_LOOP = "effect_update_depth_exceeded"


@pytest.fixture(scope="module")
def app_page(feature_engine):
    with served(feature_engine) as app_page:
        yield app_page


@pytest.fixture
def tab(browser, app_page):
    """A fresh tab on the page, its script errors collected in `tab.errors`."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 1100})
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    page.locator("#prompt textarea").wait_for(timeout=TIMEOUT_MS)
    yield page
    page.close()


def set_number(page, elem_id: str, value) -> None:
    """A slider's number box: type the value, Enter."""
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


#: The chip beside Generate shows a picture.
CHIP_SHOWS = "() => !!document.querySelector('#picture-chip #picture-chip-image img')?.checkVisibility()"
#: Two animation frames of the tab: a script stuck in a loop never lets one be drawn.
TWO_FRAMES = "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(true))))"


def frozen(page) -> bool:
    """Whether the tab's script is stuck after the update it shows: Svelte's loop guard fired, or the tab draws no
    frame. Called once the update that could start the loop is on the page (the server's picture in the mask editor,
    a Vary's answer): the guard throws inside that update's flush, before the next frame is drawn. (An 8 s watch
    after each such step cost half a minute of this file; each test still fails on a loop error that comes later.)"""
    try:
        page.wait_for_function(TWO_FRAMES, timeout=TIMEOUT_MS)
    except playwright_api.TimeoutError:
        return True
    return any(EFFECT_LOOP in error for error in page.errors)


def test_lora_picker_and_speed_sliders_reach_the_request(tab, feature_engine):
    open_advanced(tab)
    tab.locator("#lora-1 input").click()
    tab.get_by_role("option", name="kohya_sgm", exact=True).click()
    set_number(tab, "lora-weight-1", 0.6)
    set_number(tab, "cfg-end", 0.5)
    set_number(tab, "deepcache", 2)
    set_steps(tab, 4)
    tab.locator("#prompt textarea").fill("a cabin in the snow")
    tab.locator("#generate").click()
    status = tab.locator("#status")
    status.get_by_text("LoRA kohya_sgm 0.6").wait_for(timeout=TIMEOUT_MS)
    text = status.inner_text()
    assert f"{FEATURE_DEVICES} images in" in text and "· CFG end 0.5 · DeepCache 2 · LoRA kohya_sgm 0.6" in text, text
    run = feature_engine.recent_runs[-1]
    assert run["steps"] == 4 and run["done"] == 4 and not run["stopped"]
    assert feature_engine.loras.current == (("kohya_sgm", 0.6, 0.6),)
    tab.screenshot(path=str(ARTIFACTS / "features-levers.png"))
    assert not tab.errors, tab.errors


def test_upload_paint_generate_inpainted_then_vary_strong(tab, feature_engine):
    open_advanced(tab)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    tab.locator("#init-image input[type=file]").set_input_files(str(PICTURE))
    tab.locator("#init-image img").wait_for(timeout=TIMEOUT_MS)
    tab.locator("#mask-editor button[aria-label=Brush]").wait_for(timeout=TIMEOUT_MS)  # the server set the editor's
    tab.wait_for_function(CHIP_SHOWS, timeout=TIMEOUT_MS)  # picture and the chip's: the update the loop came with
    assert not frozen(tab), tab.errors  # web/page/examples.py: why the page has no gr.Dataset
    paint_a_stroke(tab)
    set_steps(tab, 4)
    tab.locator("#prompt textarea").fill("a cabin in the snow")
    tab.locator("#generate").click()
    status = tab.locator("#status")
    status.get_by_text("inpainted").wait_for(timeout=TIMEOUT_MS)
    assert "inpainted, strength 0.75" in status.inner_text() and "· 3 steps," in status.inner_text()
    tab.screenshot(path=str(ARTIFACTS / "features-inpainted.png"))

    tab.locator("#gallery img").first.click()
    tab.locator("#vary-strong").click()
    status.get_by_text("strength 0.85").wait_for(timeout=TIMEOUT_MS)
    assert not frozen(tab), tab.errors  # web/page/examples.py: why the page has no gr.Dataset
    assert "from a picture, strength 0.85" in status.inner_text()
    tab.screenshot(path=str(ARTIFACTS / "features-vary.png"))
    assert not [error for error in tab.errors if EFFECT_LOOP in error]


#: The status line holds a finished request's answer that differs from `before` (each answer rewrites it: its seed).
NEW_ANSWER = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && / images in /.test(text); }"""


def generate(tab, press: str = "#generate") -> str:
    """Press Generate (or a Vary button) and wait for its answer: the status line. No answer: the failure names the
    page's toasts and status line (a refusal shows as a toast and leaves the status line empty)."""
    before = tab.locator("#status").inner_text()
    tab.locator(press).click()
    try:
        tab.wait_for_function(NEW_ANSWER, arg=before, timeout=TIMEOUT_MS)
    except playwright_api.TimeoutError:
        toasts = tab.locator(".toast-body").all_inner_texts()
        tab.screenshot(path=str(ARTIFACTS / "features-no-answer.png"), full_page=True)
        pytest.fail(f"no answer to {press}: toasts {toasts}, status {tab.locator('#status').inner_text()!r}")
    return tab.locator("#status").inner_text()


def chip_shows(tab) -> bool:
    return tab.evaluate(CHIP_SHOWS)


def test_vary_is_one_shot_and_a_kept_picture_shows_beside_generate(tab):
    """Issue 68: a text-to-image result clicked, Vary (strong): that one run redraws it at 0.85, and the next Generate
    draws from the prompt again (Vary once filled the hidden picture input, and every later Generate started from
    it). "Use as picture" keeps a result: it shows beside Generate, every Generate starts from it, the mask editor has
    it to paint on; its ✕ drops it."""
    tab.locator("#prompt textarea").fill("a lighthouse at dusk")
    assert f"{FEATURE_DEVICES} images in" in generate(tab)
    tab.locator("#gallery img").first.click()
    assert "from a picture, strength 0.85" in generate(tab, "#vary-strong")
    assert not frozen(tab), tab.errors  # web/page/examples.py: why the page has no gr.Dataset
    assert not chip_shows(tab)
    assert "from a picture" not in (text := generate(tab)), text

    tab.locator("#gallery img").first.click()
    tab.locator("#use-picture").click()
    tab.wait_for_function(CHIP_SHOWS, timeout=TIMEOUT_MS)
    tab.screenshot(path=str(ARTIFACTS / "features-picture-chip.png"))
    assert "from a picture, strength 0.75" in (text := generate(tab)), text
    assert "from a picture, strength 0.75" in (text := generate(tab)), text  # kept
    # The picture is in the editor, to paint a mask on: open it.
    open_advanced(tab)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    tab.locator("#init-image img").wait_for(timeout=TIMEOUT_MS)
    tab.locator("#mask-editor button[aria-label=Brush]").wait_for(timeout=TIMEOUT_MS)  # the editor shows, with it
    assert not frozen(tab), tab.errors
    tab.locator("#mask-editor button[aria-label=Brush]").click(timeout=30_000)
    tab.locator("#mask-editor .pixi-target canvas").wait_for(timeout=30_000)
    tab.screenshot(path=str(ARTIFACTS / "features-vary.png"), full_page=True)

    tab.locator("#drop-picture").click()
    tab.wait_for_function("() => !document.querySelector('#init-image img')", timeout=TIMEOUT_MS)
    assert not chip_shows(tab)
    assert "from a picture" not in (text := generate(tab)), text
    # Gradio's editor logs "reading 'background_image'" when given a picture while hidden; it starts all the same.
    assert not [error for error in tab.errors if "background_image" not in error], tab.errors


#: Each of the picture's inputs: [elem_id, whether it shows an "Error" badge, whether a status tracker is busy].
INPUT_STATUS = """() => ['init-image', 'mask-editor', 'strength'].map((id) => {
    const block = document.getElementById(id);
    const trackers = [...block.querySelectorAll('[data-testid=status-tracker]')];
    return [id, !!block.querySelector('.error')?.checkVisibility(),
            trackers.some((t) => t.checkVisibility() && /pending|generating/.test(t.className))];
})"""


def test_a_refused_vary_leaves_the_picture_as_it_was(tab):
    """Issue 68: a picture uploaded, Vary with no gallery image clicked: one sentence, and the picture, the mask
    editor and Strength as they were (they showed red "Error" badges and a spinner, the picture hidden in its
    section); the picture shows beside Generate, and the next Generate starts from it."""
    tab.locator("#prompt textarea").fill("a cabin in the snow")
    open_advanced(tab)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    tab.locator("#init-image input[type=file]").set_input_files(str(PICTURE))
    tab.locator("#init-image img").wait_for(timeout=TIMEOUT_MS)
    tab.locator("#mask-editor button[aria-label=Brush]").wait_for(timeout=TIMEOUT_MS)  # the editor has the picture
    tab.locator("#vary-subtle").click()
    tab.get_by_text("Click an image of the gallery first, then Vary.").first.wait_for(timeout=TIMEOUT_MS)
    tab.wait_for_timeout(1_000)  # what the refusal did to the page: Gradio's badges come with its toast
    tab.screenshot(path=str(ARTIFACTS / "features-refused-vary.png"), full_page=True)
    marked = tab.evaluate(INPUT_STATUS)
    assert marked == [["init-image", False, False], ["mask-editor", False, False], ["strength", False, False]], marked
    assert tab.locator("#init-image img").is_visible() and chip_shows(tab)
    assert "from a picture, strength 0.75" in (text := generate(tab)), text
    assert not [error for error in tab.errors if "background_image" not in error], tab.errors


def test_a_non_image_picture_is_one_sentence_at_upload(tab, tmp_path, capfd, caplog):
    """A file that is not a picture (named like one, so the browser sends it), uploaded under "Start from a
    picture": one sentence at once (not after Generate), the picture and the editor cleared, one log line, no
    traceback (Gradio's own decoding of the upload printed ~40 lines of ComponentProcessingError)."""
    not_a_picture = tmp_path / "notes.png"
    not_a_picture.write_text("meeting notes, not a picture\n" * 20)
    open_advanced(tab)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    with caplog.at_level("INFO", logger="sdxl_jax.app"):
        tab.locator("#init-image input[type=file]").set_input_files(str(not_a_picture))
        sentence = "The image is not a picture in a format this server reads"
        tab.get_by_text(sentence).first.wait_for(timeout=TIMEOUT_MS)
        tab.wait_for_function("() => !document.querySelector('#init-image img')", timeout=TIMEOUT_MS)
    tab.screenshot(path=str(ARTIFACTS / "features-not-a-picture.png"))
    refused = [r for r in caplog.records if "picture upload was refused" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]
    logged = capfd.readouterr()
    assert "Traceback" not in logged.err + logged.out and "ComponentProcessingError" not in logged.err + logged.out
    assert tab.locator("#mask-editor img").count() == 0


#: True once the middle of the mask editor's canvas is what a pointer there would touch (not a tool still laying
#: itself out over it, not off screen): a stroke aimed at a box measured earlier landed on <html> under load.
CANVAS_UNDER_POINTER = """() => {
    const canvas = document.querySelector('#mask-editor .pixi-target canvas');
    if (!canvas) return false;
    const box = canvas.getBoundingClientRect();
    const hit = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
    return box.width > 0 && hit === canvas;
}"""


def paint_a_stroke(tab) -> None:
    """The mask editor's brush, one stroke across the middle of the picture."""
    editor = tab.locator("#mask-editor")
    editor.locator("button[aria-label=Brush]").click(timeout=TIMEOUT_MS)
    canvas = editor.locator(".pixi-target canvas")
    canvas.wait_for(timeout=TIMEOUT_MS)
    canvas.scroll_into_view_if_needed(timeout=TIMEOUT_MS)
    tab.wait_for_function(CANVAS_UNDER_POINTER, timeout=TIMEOUT_MS)
    box = canvas.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    tab.mouse.move(x - 30, y - 10)
    tab.mouse.down()
    # Four pointer moves: each waits for the editor to draw a frame, a third of a second in headless Chromium (30 moves
    # took 11 s of each painting test); the line between them is painted all the same.
    tab.mouse.move(x + 26, y + 18, steps=4)
    tab.mouse.up()


def test_generate_sends_the_mask_editor_only_once_something_is_painted(tab, tmp_path):
    """Issue 48: from a picture, 4.5 s passed in the browser before Generate's request (the mask editor exporting its
    picture, strokes and composite at the picture's size, then three uploads). The picture is on the server already:
    nothing painted, Generate's request carries no editor files; painted, the editor's layers go with it. (Gradio
    6.31's editor also uploads its layers in the background as the page updates, after the request has gone: counted
    and printed, not checked.) Prints the time from the click to the answer (a figure for the report, not a check)."""
    big = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1024, 1024, 3), dtype=np.uint8)).save(big)
    open_advanced(tab)
    set_steps(tab, 3)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    tab.locator("#init-image input[type=file]").set_input_files(str(big))
    tab.locator("#init-image img").wait_for(timeout=TIMEOUT_MS)
    tab.locator("#mask-editor button[aria-label=Brush]").wait_for(timeout=TIMEOUT_MS)  # the editor has the picture
    uploads: list[str] = []
    joins: list[str] = []  # each event's request body: its inputs
    tab.on("request", lambda r: "/upload" in r.url and r.method == "POST" and uploads.append(r.url))
    tab.on("request", lambda r: "/queue/join" in r.url and joins.append(r.post_data or ""))
    status = tab.locator("#status")
    tab.locator("#prompt textarea").fill("a cabin in the snow")
    started = time.perf_counter()
    tab.locator("#generate").click()
    status.get_by_text("from a picture, strength").wait_for(timeout=TIMEOUT_MS)
    plain_s, plain_uploads, plain_request = time.perf_counter() - started, len(uploads), joins[0]
    print(f"1024² picture, nothing painted: {plain_s:.2f} s from click to answer, {plain_uploads} uploads")
    assert "inpainted" not in status.inner_text()

    paint_a_stroke(tab)
    uploads.clear()
    joins.clear()
    started = time.perf_counter()
    tab.locator("#prompt textarea").press("Enter")  # Enter takes the strokes too
    status.get_by_text("inpainted, strength").wait_for(timeout=TIMEOUT_MS)
    painted_s, painted_uploads, painted_request = time.perf_counter() - started, len(uploads), joins[0]
    print(f"1024² picture, painted: {painted_s:.2f} s from Enter to answer, {painted_uploads} uploads")
    assert "layer_0.png" not in plain_request and "composite.png" not in plain_request
    assert "layer_0.png" in painted_request and "photo.png" in plain_request  # the strokes; the picture as uploaded
    assert not tab.errors, tab.errors


def test_outpaint_shows_the_grown_canvas_and_generates_it(tab, feature_engine):
    """Issue 69: "Outpaint" beside image to image, a direction and the pixels: the grown canvas shows (the picture
    fitted into 64×64 less the border, the border filled), Generate outpaints it, compiling nothing."""
    before = feature_engine.compile_count
    tab.locator("#prompt textarea").fill("a cabin in the snow")
    open_advanced(tab)
    open_section(tab, "picture-settings", "Start from a picture", "#init-image")
    tab.locator("#init-image input[type=file]").set_input_files(str(PICTURE))
    tab.locator("#init-image img").wait_for(timeout=TIMEOUT_MS)
    tab.locator("#picture-mode").get_by_text("Outpaint").click()
    tab.locator("#outpaint-directions").get_by_text("right").click()  # left alone: the default's right unticked
    set_number(tab, "outpaint-pixels", 16)
    tab.locator("#outpaint-canvas img").wait_for(timeout=TIMEOUT_MS)
    tab.screenshot(path=str(ARTIFACTS / "features-outpaint.png"), full_page=True)
    assert "outpainted left=16, strength 0.75" in (text := generate(tab)), text
    assert feature_engine.compile_count == before
    assert not [error for error in tab.errors if "background_image" not in error], tab.errors
