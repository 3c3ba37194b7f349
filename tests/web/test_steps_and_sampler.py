"""Steps and sampler per request through the page's API and in a browser (the host loop, pipeline/host/loop.py):
any step count and sampler, never a new program; one sentence for a bad one; the slider, the menu and Stop.

Against the page around the session's `ui_engine` (tiny model, 4 steps by default, two sizes, progress on), through
gradio_client and Debian's Chromium.
"""

from __future__ import annotations

import pytest
from conftest import (
    ARTIFACTS,
    LONG,
    TIMEOUT_MS,
    UI_SIZES,
    choose_size,
    generate_and_stop,
    needs_chromium,
    open_advanced,
    set_steps,
)
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.contract.image_files import read_parameters
from pipeline.contract.sampler_names import SAMPLER_NAMES
from pipeline.contract.xyz_plot import SCRIPT_ARGS
from web.page.size_labels import size_label


def parameters_of(item) -> str:
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
        (
            {"sampler": "DPM2"},
            "Unknown sampler 'DPM2'; choose one of: Euler, Euler a, DPM++ 2M, DPM++ 2M Karras, "
            "DPM++ 2M SDE, UniPC, DDIM, Heun, LMS, LCM, DPM++ 2M SDE Karras, "
            "DPM++ 2M SDE Exponential, LMS Karras.",
        ),
    ],
)
def test_bad_steps_or_sampler_is_one_sentence(ui_client, kwargs, message):
    with pytest.raises(AppError) as error:
        ui_client.predict(prompt="a cat", api_name="/generate", **kwargs)
    assert str(error.value) == message


def test_api_lists_steps_and_sampler_with_defaults(ui_client, ui_engine):
    info = ui_client.view_api(print_info=False, return_format="dict")
    params = {p["parameter_name"]: p for p in info["named_endpoints"]["/generate"]["parameters"]}
    assert params["steps"]["parameter_default"] == ui_engine.config.steps
    assert params["sampler"]["parameter_default"] == "Euler"


def test_an_xyz_plot_through_the_api_answers_its_grid_then_each_cell_and_compiles_nothing(ui_client, ui_engine):
    """/xyz_plot (the page's "Run plot" for gradio_client): Steps across, CFG Scale down, 2 x 2: the grid, then the
    four cells (X fastest), each with its own values in its parameters, the grid's with the plot's axes; nothing
    compiles; a bad value is one sentence, naming the axis."""
    before = ui_engine.compile_count
    gallery, seed, status = ui_client.predict(
        prompt="a lighthouse",
        seed=4,
        randomize_seed=False,
        x_type="Steps",
        x_values="2, 3",
        y_type="CFG Scale",
        y_values="3, 5",
        api_name="/xyz_plot",
    )
    cells = [(steps, cfg) for cfg in (3, 5) for steps in (2, 3)]
    assert [item["caption"] for item in gallery] == [
        "grid 1 / 1",
        *(f"Steps: {steps}, CFG Scale: {cfg}" for steps, cfg in cells),
    ]
    assert seed == 4 and status.startswith("X/Y/Z plot: 4 of 4 cells in ") and status.endswith("· seed 4"), status
    with Image.open(gallery[0]["image"]) as grid:
        assert grid.width > 2 * UI_SIZES[0][1] and grid.height > 2 * UI_SIZES[0][0]
    assert "Script: X/Y/Z plot, X Type: Steps, X Values: " in parameters_of(gallery[0])
    for item, (steps, cfg) in zip(gallery[1:], cells, strict=True):
        assert f"Steps: {steps}, Sampler: Euler, CFG scale: {cfg}, Seed: 4," in parameters_of(item)
    assert ui_engine.compile_count == before
    with pytest.raises(AppError) as error:
        ui_client.predict(prompt="a cat", x_type="Steps", x_values="2, two", api_name="/xyz_plot")
    assert str(error.value) == "Steps takes numbers; got 'two'."
    info = ui_client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/xyz_plot"]
    names = [parameter["parameter_name"] for parameter in info["parameters"]]
    assert names[-9:] == list(SCRIPT_ARGS[:9]) and "previews" not in names and "picture" not in names


# ---- in the browser -----------------------------------------------------------------------------------------------


@pytest.mark.browser
@needs_chromium
def test_steps_slider_sampler_menu_and_stop_in_the_browser(ui_page, browser, ui_engine):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(ui_page.local_url, timeout=TIMEOUT_MS)
    open_advanced(page)
    page.locator("#sampler input").click()
    page.get_by_role("option", name="DPM++ 2M Karras", exact=True).click()
    set_steps(page, 3)
    page.locator("#prompt textarea").fill("a paper boat on a pond")
    page.locator("#generate").click()
    page.locator("#status").get_by_text("3 steps, DPM++ 2M Karras").wait_for(timeout=TIMEOUT_MS)

    choose_size(page, size_label(*UI_SIZES[1]))  # 224×128: 2.4× the steps' work of 64×64, Stop lands sooner
    set_steps(page, LONG)
    assert generate_and_stop(page), f"Stop never reached a {LONG}-step request in 3 tries"
    page.screenshot(path=str(ARTIFACTS / "stopped.png"))
    last = ui_engine.recent_runs[-1]
    assert last["stopped"] and last["done"] < LONG
    assert f"Stopped at step {last['done']} / {LONG}." in page.locator("#status").inner_text()
    assert len(page.locator("#gallery img").all()) == 8  # the previous images stay

    set_steps(page, 2)  # the queue keeps serving
    page.locator("#generate").click()
    page.locator("#status").get_by_text("2 steps, DPM++ 2M Karras").wait_for(timeout=TIMEOUT_MS)
    assert not errors, errors
    page.close()
