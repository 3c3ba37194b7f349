"""The loop on the host (issue 17): steps and sampler per request, Stop, and a restart on a warm cache.

Through gradio_client and Debian's Chromium against the app around the session's `ui_engine` (tiny model, 4 steps
by default, two sizes, progress on); the warm-cache restart launches `python app.py` twice on one cache directory.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import time

import pytest
from conftest import (
    GALLERY_LOADS,
    LONG,
    TIMEOUT_MS,
    UI_SIZES,
    headless_chromium,
    open_advanced,
    set_steps,
    stop_then_generate,
)
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.host.plan import SAMPLER_NAMES

CHROMIUM = "/usr/bin/chromium"


def parameters_of(item) -> str:
    from pipeline.host.images import read_parameters

    return read_parameters(item["image"])


def test_steps_and_sampler_per_request_through_the_api_compile_nothing(ui_client, ui_engine):
    before = ui_engine.compile_count
    for steps, sampler in [(1, "Euler"), (7, "Euler a"), (3, "DPM++ 2M"), (9, "DPM++ 2M Karras"), (2, "dpm++ 2m")]:
        gallery, seed, status = ui_client.predict(
            prompt="a lighthouse", seed=4, randomize_seed=False, steps=steps, sampler=sampler, api_name="/generate"
        )
        name = next(label for label in SAMPLER_NAMES if label.lower() == sampler.lower())
        assert f"· {steps} step{'s' if steps != 1 else ''}, {name} ·" in status
        text = parameters_of(gallery[0])
        assert f"Steps: {steps}, Sampler: {name}," in text
        assert ui_engine.recent_runs[-1]["steps"] == steps
    assert ui_engine.compile_count == before  # steps and sampler are arguments, never a new program


def test_same_request_same_pixels_and_samplers_differ(ui_client):
    def pixels(sampler):
        gallery, _, _ = ui_client.predict(
            prompt="a red kite", seed=9, randomize_seed=False, steps=6, sampler=sampler, api_name="/generate"
        )
        with Image.open(gallery[0]["image"]) as image:
            return image.tobytes()

    karras = pixels("DPM++ 2M Karras")
    assert pixels("DPM++ 2M Karras") == karras
    assert pixels("Euler") != karras


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "Steps must be a whole number from 1 to 100; got 0."),
        ({"steps": 101}, "Steps must be a whole number from 1 to 100; got 101."),
        ({"steps": 2.5}, "Steps must be a whole number from 1 to 100; got 2.5."),
        ({"sampler": "LMS"}, "Unknown sampler 'LMS'; choose one of: Euler, Euler a, DPM++ 2M, DPM++ 2M Karras."),
    ],
)
def test_bad_steps_or_sampler_is_one_sentence(ui_client, kwargs, message):
    with pytest.raises(AppError) as error:
        ui_client.predict(prompt="a cat", api_name="/generate", **kwargs)
    assert str(error.value) == message


def test_cancel_through_the_client_stops_at_the_next_step_and_frees_the_queue(ui_client, ui_engine):
    job = ui_client.submit(prompt="a castle", steps=LONG, api_name="/generate")
    while True:
        data = job.status().progress_data
        if data and data[0].index is not None and data[0].index >= 2:
            break
        assert not job.done(), "the request ended before it could be cancelled"
        time.sleep(0.005)
    runs = len(ui_engine.recent_runs)
    job.cancel()
    gallery, _, status = ui_client.predict(prompt="a castle", steps=2, api_name="/generate")  # the next request runs
    assert len(gallery) == 8 and "2 steps" in status
    history = list(ui_engine.recent_runs)
    cancelled = history[runs - 1] if history[runs - 1]["steps"] == LONG else history[runs]
    assert cancelled["stopped"] and 2 <= cancelled["done"] < LONG  # stopped between steps, well before the end


def test_api_lists_steps_and_sampler_with_defaults(ui_client, ui_engine):
    info = ui_client.view_api(print_info=False, return_format="dict")
    params = {p["parameter_name"]: p for p in info["named_endpoints"]["/generate"]["parameters"]}
    assert params["steps"]["parameter_default"] == ui_engine.config.steps
    assert params["sampler"]["parameter_default"] == "Euler"


# ---- in the browser -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as browser:
        yield browser


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("CI"), reason="needs /usr/bin/chromium")
def test_steps_slider_sampler_menu_and_stop_in_the_browser(ui_demo, browser, ui_engine):
    artifacts = pathlib.Path(__file__).resolve().parent.parent / "artifacts" / "browser"
    artifacts.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(ui_demo.local_url, timeout=TIMEOUT_MS)
    open_advanced(page)
    page.locator("#sampler input").click()
    page.get_by_role("option", name="DPM++ 2M Karras", exact=True).click()
    set_steps(page, 3)
    page.locator("#prompt textarea").fill("a paper boat on a pond")
    page.locator("#generate").click()
    page.locator("#status").get_by_text("3 steps, DPM++ 2M Karras").wait_for(timeout=TIMEOUT_MS)

    set_steps(page, LONG)
    page.locator("#generate").click()
    page.wait_for_function(
        "() => /step ([2-9]|\\d\\d) \\/ 100/.test(document.body.innerText)", timeout=TIMEOUT_MS
    )  # fmt: skip
    page.locator("#stop").click()
    stopped = page.locator("#status").get_by_text("Stopped at step")
    stopped.wait_for(timeout=60_000)
    page.screenshot(path=str(artifacts / "stopped.png"))
    last = ui_engine.recent_runs[-1]
    assert last["stopped"] and last["done"] < LONG
    assert f"Stopped at step {last['done']} / {LONG}." in page.locator("#status").inner_text()
    assert len(page.locator("#gallery img").all()) == 8  # the previous images stay

    set_steps(page, 2)  # the queue keeps serving
    page.locator("#generate").click()
    page.locator("#status").get_by_text("2 steps, DPM++ 2M Karras").wait_for(timeout=TIMEOUT_MS)
    assert not errors, errors
    page.close()


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("CI"), reason="needs /usr/bin/chromium")
def test_images_after_a_stop_load_in_the_same_tab(ui_demo, browser, ui_engine):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    loads = stop_then_generate(page, ui_demo.local_url, "4 steps")
    assert len(loads) == ui_engine.num_images
    assert all(status == 200 and decoded for status, decoded in loads), loads
    set_steps(page, 3)  # and every later request of that tab
    page.locator("#generate").click()
    page.locator("#status").get_by_text("3 steps").wait_for(timeout=TIMEOUT_MS)
    loads = page.evaluate(GALLERY_LOADS)
    assert loads and all(status == 200 and decoded for status, decoded in loads), loads
    page.close()


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not os.environ.get("CI"), reason="needs /usr/bin/chromium")
def test_closing_the_tab_stops_its_request(ui_demo, browser, ui_engine):
    page = browser.new_page()
    page.goto(ui_demo.local_url, timeout=TIMEOUT_MS)
    open_advanced(page)
    set_steps(page, LONG)
    page.locator("#prompt textarea").fill("a closed tab")
    page.locator("#generate").click()
    page.wait_for_function("() => /step [2-9] \\/ 100/.test(document.body.innerText)", timeout=TIMEOUT_MS)
    runs = len(ui_engine.recent_runs)
    page.close()
    deadline = time.monotonic() + 60
    while len(ui_engine.recent_runs) == runs and time.monotonic() < deadline:
        time.sleep(0.05)
    last = ui_engine.recent_runs[-1]
    assert last["steps"] == LONG and last["stopped"] and last["done"] < LONG


# ---- a restart on a warm compilation cache ----------------------------------------------------------------------


@pytest.mark.slow
def test_restart_takes_every_served_program_from_the_cache():
    """Progress on (the default): no program has a host callback, so a second start compiles nothing."""
    from bench.hostloop import app_start

    args = ["--model", "tiny", "--sizes", ",".join(f"{w}x{h}" for h, w in UI_SIZES), "--steps", "2",
            "--dtype", "float32", "--cpu-devices", "2"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="sdxl-warm-") as tmp:
        cold = app_start(args, pathlib.Path(tmp) / "cache", "cold", timeout_s=900)
        warm = app_start(args, pathlib.Path(tmp) / "cache", "warm", timeout_s=900)
    assert cold.served_programs == warm.served_programs == 1 + 3 * len(UI_SIZES)  # encode + start/step/decode each
    assert cold.served_hits == 0 and cold.not_cached == 0
    assert warm.served_hits == warm.served_programs and warm.not_cached == 0
