"""The "Second pass" section (the hires fix) in a real browser (Debian's Chromium via Playwright), around the engine of
tests/engine/test_refiner_together.py (conftest's `refiner_hires_engine`: tiny-pt + the tiny refiner on 2 devices at
64x64, hires scale 2; no new engine configuration): open the section, pick the scale (Upscale by offers Off and the
server's ×2 only), set the steps, denoise and upscaler and the refiner's switch, Generate; the images shown are at the
hires size, as their captions and the status line say, their parameters carry the second pass and the refiner (which
ran in it), no error toast.

Screenshot: artifacts/browser/second-pass.png (git-ignored).
"""

from __future__ import annotations

import httpx
import pytest
from conftest import (
    ARTIFACTS,
    FEATURE_DEVICES,
    TEST_SIZE,
    TIMEOUT_MS,
    needs_chromium,
    open_advanced,
    open_section,
    page_client,
    served,
    served_programs_only,
    set_sliders,
)
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.contract import image_files
from pipeline.contract.hires import hires_size
from pipeline.contract.parameters import parse_infotext

pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def app_page(refiner_hires_engine):
    with served(refiner_hires_engine) as app_page:
        yield app_page


def test_second_pass_section_reaches_the_engine(browser, app_page, refiner_hires_engine, tmp_path):
    engine = refiner_hires_engine
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tab = browser.new_page(viewport={"width": 1280, "height": 1100})
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        tab.goto(app_page.local_url, timeout=TIMEOUT_MS)
        tab.locator("#prompt textarea").wait_for(timeout=TIMEOUT_MS)
        open_advanced(tab)
        open_section(tab, "hires-settings", "Second pass", "#hires-scale input[type=radio]")
        tab.locator("#hires-scales").get_by_text("(off) or 2").wait_for(timeout=TIMEOUT_MS)  # the server's scales
        assert tab.locator("#hires-scale label").all_inner_texts() == ["Off", "×2"]  # those only (not 1 to 4)
        tab.locator("#hires-upscaler input").click()
        tab.get_by_role("option", name="Lanczos", exact=True).click()
        tab.locator("#prompt textarea").fill("a harbour at noon")
        set_sliders(tab, {"steps": 2, "hires-steps": 2, "hires-denoise": 0.5, "refiner-switch": 0.8})
        scale = tab.locator("#hires-scale").get_by_label("×2", exact=True)
        scale.check()
        assert scale.is_checked()
        with served_programs_only(engine):  # the engine builds its programs on first use (conftest)
            tab.locator("#generate").click()
            # the answer, or an error toast at once (not a wait to the timeout)
            tab.wait_for_function(
                "(n) => document.querySelector('.toast-body') || "
                "document.querySelector('#status')?.innerText.includes(`${n} images in`)",
                arg=FEATURE_DEVICES,
                timeout=TIMEOUT_MS,
            )
            assert tab.locator(".toast-body").count() == 0, tab.locator(".toast-body").all_inner_texts()
            tab.wait_for_function(
                f"() => document.querySelectorAll('#gallery img').length === {FEATURE_DEVICES}", timeout=TIMEOUT_MS
            )
        assert tab.locator(".toast-body").count() == 0, tab.locator(".toast-body").all_inner_texts()
        run = engine.recent_runs[-1]
        side = hires_size((TEST_SIZE, TEST_SIZE), 2.0, engine.latent_multiple)[0]
        shown = tmp_path / "shown.jpg"
        shown.write_bytes(httpx.get(tab.eval_on_selector("#gallery img", "img => img.src")).content)
        settings = parse_infotext(image_files.read_parameters(shown)).settings
        status = tab.locator("#status").inner_text()
        assert " · 128×128 (hires ×2 from 64×64) · 2 + 2 steps, " in status, status  # the images' size, both passes
        assert "seed" in tab.locator("#gallery").inner_text() and "64×64" not in tab.locator("#gallery").inner_text()
        assert run["steps"] == 2 + 2 and run["done"] == 4 and not run["stopped"], (run, settings)  # both passes ran
        assert Image.open(shown).size == (side, side) == (128, 128)
        assert settings["Size"] == f"{TEST_SIZE}x{TEST_SIZE}"  # A1111 writes the first pass's size
        assert (
            settings["Hires upscale"],
            settings["Hires upscaler"],
            settings["Hires steps"],
            settings["Denoising strength"],
        ) == ("2", "Lanczos", "2", "0.5"), settings
        assert (settings["Refiner"], settings["Refiner switch at"]) == ("tiny-refiner", "0.8"), settings
        assert not errors, errors
    finally:
        tab.screenshot(path=str(ARTIFACTS / "second-pass.png"), full_page=True)  # also what a failure looked like
        tab.close()


def test_second_pass_through_gradio_client_compiles_only_served_programs(
    app_page, refiner_hires_engine, tmp_path_factory
):
    """The API's callers (gradio_client) ask for the second pass by its fields: each upscaler kind and the refiner in
    the second pass, nothing compiles but the served programs the engine builds on first use (conftest's
    `served_programs_only`), each picture at the hires size with its parameters."""
    engine = refiner_hires_engine
    client = page_client(app_page, tmp_path_factory)
    for upscaler, switch in (("Latent (bicubic)", 1.0), ("Nearest", 0.8)):
        with served_programs_only(engine):
            gallery, seed, status = client.predict(
                prompt="a harbour at noon",
                seed=3,
                randomize_seed=False,
                steps=2,
                hires_scale=2,
                hires_steps=2,
                hires_denoise=0.5,
                hires_upscaler=upscaler,
                refiner_switch=switch,
                api_name="/generate_png",
            )
        assert seed == 3 and len(gallery) == FEATURE_DEVICES
        picture = gallery[0]["image"]
        assert Image.open(picture).size == (128, 128)
        settings = parse_infotext(image_files.read_parameters(picture)).settings
        assert (settings["Hires upscale"], settings["Hires upscaler"]) == ("2", upscaler), settings
        assert ("Refiner" in settings) == (switch < 1), settings
        assert [item["caption"] for item in gallery] == ["seed 3 · 128×128", "seed 4 · 128×128"]
        assert " · 128×128 (hires ×2 from 64×64) · 2 + 2 steps, " in status, status
    with pytest.raises(AppError, match=r"^hires_scale 3 is not offered by this server"):  # the API's own name
        client.predict(prompt="a harbour", hires_scale=3, api_name="/generate_png")
