"""The page people expect: live step progress, aspect ratios, cached examples.

One page around the session's `ui_engine` (tiny model, 4 steps, sizes 64x64 and 224x128, progress on), launched
once for the module and driven by gradio_client and by Debian's Chromium (Playwright). The page's engine is a
counting test double around the real generator: it only counts `generate` calls, everything else is the real thing.
Screenshots: artifacts/browser/progress-mid-request.png, ratio-16x9.png, phone-aspect.png.
"""

from __future__ import annotations

import time

import pytest
from conftest import ARTIFACTS, TIMEOUT_MS, UI_SIZES, UI_STEPS, needs_chromium, page_client, served
from gradio_client.exceptions import AppError
from PIL import Image

from pipeline.contract.image_files import read_parameters
from pipeline.contract.styles import load_examples
from web.page.size_labels import size_label

SQUARE, WIDE = (size_label(h, w) for h, w in UI_SIZES)  # "64×64 (1:1)", "224×128 (16:9)"


class CountingGenerator:
    """The real generator, with its `generate` calls counted (to prove a cached example runs nothing)."""

    def __init__(self, generator) -> None:
        self._generator = generator
        self.calls = 0

    def generate(self, *args, **kwargs):
        self.calls += 1
        return self._generator.generate(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._generator, name)


@pytest.fixture(scope="module")
def counting(ui_engine):
    return CountingGenerator(ui_engine)


@pytest.fixture(scope="module")
def app_page(counting):
    with served(counting) as app_page:
        yield app_page


@pytest.fixture(scope="module")
def client(app_page, tmp_path_factory):
    return page_client(app_page, tmp_path_factory)


def size_of(item) -> tuple[int, int]:
    with Image.open(item["image"]) as image:
        return image.size


def test_progress_stays_readable_between_previews(app_page):
    """What docs/api.md tells API clients to read: `job.status().progress_data` of a running request, on a client that
    does not download every preview (one that does falls behind the stream). A preview's message carries no progress
    and gradio_client's status is the last message, so each preview is followed by the last step again: polls see
    the progress, not None, on most of the run (it was None on most polls)."""
    from gradio_client import Client

    client = Client(app_page.local_url, verbose=False, download_files=False)
    job = client.submit(
        prompt="a lighthouse", steps=24, seed=5, randomize_seed=False, previews=True, api_name="/generate"
    )
    polls: list[int | None] = []
    while not job.done():
        data = job.status().progress_data
        if data or polls:  # from the first progress on
            polls.append(data[0].index if data else None)
        time.sleep(0.005)
    job.result()
    seen = [index for index in polls if index is not None]
    readable = len(seen) / max(len(polls), 1)
    print(f"progress readable on {readable:.0%} of {len(polls)} polls")
    assert seen == sorted(seen) and seen[-1] >= 20, seen
    assert readable > 0.75, f"progress_data was None on {1 - readable:.0%} of the polls"


def test_progress_reaches_the_client_and_sizes_work(client, ui_engine):
    before = ui_engine.compile_count
    job = client.submit(prompt="a lighthouse", aspect_ratio=WIDE, seed=5, randomize_seed=False, api_name="/generate")
    seen: list[tuple[int, int, str]] = []
    while not job.done():
        for unit in job.status().progress_data or []:
            entry = (unit.index, unit.length, unit.unit)
            if not seen or seen[-1] != entry:
                seen.append(entry)
        time.sleep(0.005)
    gallery, seed, status = job.result()
    assert seen, "no progress update arrived through job.status()"
    assert all(length == UI_STEPS and unit == "steps" and 1 <= index <= UI_STEPS for index, length, unit in seen)
    assert [index for index, _, _ in seen] == sorted(index for index, _, _ in seen)
    assert {size_of(item) for item in gallery} == {(224, 128)}
    assert gallery[0]["caption"] == "seed 5 · 224×128" and "224×128" in status
    assert "Size: 224x128" in read_parameters(gallery[0]["image"])
    # The default (the first offered size) and the "WxH" spelling work too; anything else is refused in one line.
    gallery, _, _ = client.predict(prompt="a lighthouse", api_name="/generate")
    assert {size_of(item) for item in gallery} == {(64, 64)}
    gallery, _, _ = client.predict(prompt="a lighthouse", aspect_ratio="224x128", api_name="/generate")
    assert {size_of(item) for item in gallery} == {(224, 128)}
    with pytest.raises(AppError) as info:
        client.predict(prompt="a lighthouse", aspect_ratio="1024×1024 (1:1)", api_name="/generate")
    assert str(info.value) == (
        "Aspect ratio '1024×1024 (1:1)' is not offered by this server; choose one of: 64×64, 224×128 (or its "
        "ratio, e.g. 1:1)."
    )
    assert ui_engine.compile_count == before


# ---- in a browser ------------------------------------------------------------------------------------------------

#: Collects every progress text the page shows ("step k / N" ...) into window.__progress, every 5 ms.
WATCH_PROGRESS = """() => {
  window.__progress = [];
  setInterval(() => {
    for (const el of document.querySelectorAll('.progress-level-inner, [data-testid="status-tracker"]')) {
      const text = el.textContent.replace(/\\s+/g, ' ').trim();
      if (/step \\d+ \\/ \\d+/.test(text) && window.__progress.at(-1) !== text) window.__progress.push(text);
    }
  }, 5);
}"""


def wait_for_images(page, width: int, height: int) -> None:
    page.wait_for_function(
        "([w, h]) => { const imgs = [...document.querySelectorAll('#gallery img')];"
        " return imgs.length === 8 && imgs.every(i => i.complete && i.naturalWidth === w && i.naturalHeight === h); }",
        arg=[width, height],
        timeout=TIMEOUT_MS,
    )


def choose_ratio(page, label: str) -> None:
    page.locator("#advanced").get_by_text("Advanced settings").click()
    page.locator("#aspect input").click()
    page.get_by_role("option", name=label).click()


@pytest.mark.browser
@needs_chromium
def test_progress_bar_and_wide_ratio_in_browser(app_page, browser, ui_engine):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    before = ui_engine.compile_count
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    page.get_by_text("Running on 8 × cpu").wait_for(timeout=TIMEOUT_MS)
    choose_ratio(page, WIDE)
    page.evaluate(WATCH_PROGRESS)
    page.locator("#prompt textarea").fill("a watercolor fox in a snowy forest")
    page.locator("#generate").click()
    page.wait_for_function("window.__progress.length > 0", timeout=TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "progress-mid-request.png"))
    wait_for_images(page, 224, 128)
    shown = page.evaluate("window.__progress")
    assert any(f"step {UI_STEPS} / {UI_STEPS}" in text for text in shown), shown
    page.locator("#status").get_by_text("224×128").wait_for(timeout=30_000)
    page.screenshot(path=str(ARTIFACTS / "ratio-16x9.png"), full_page=True)
    assert ui_engine.compile_count == before
    assert not errors, errors
    page.close()


@pytest.mark.browser
@needs_chromium
def test_second_click_on_example_is_served_from_cache(app_page, browser, counting):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    example = load_examples()[1]
    calls = counting.calls
    page.get_by_text(example, exact=True).first.click()
    wait_for_images(page, *UI_SIZES[0][::-1])
    assert counting.calls == calls + 1  # first click: generated once (lazily) and cached
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)  # a fresh page: the gallery is empty again
    page.get_by_text(example, exact=True).first.click()
    wait_for_images(page, *UI_SIZES[0][::-1])
    assert counting.calls == calls + 1  # second click: the cached images, no new generation
    page.close()


@pytest.mark.browser
@needs_chromium
def test_phone_width_dark_with_aspect_choice(app_page, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    phone = browser.new_page(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, color_scheme="dark"
    )
    phone.goto(app_page.local_url + "?__theme=dark", timeout=TIMEOUT_MS)
    choose_ratio(phone, WIDE)
    phone.keyboard.press("Escape")
    aspect = phone.locator("#aspect").bounding_box()
    assert aspect["x"] >= 0 and aspect["x"] + aspect["width"] <= 390  # the dropdown fits the phone's width
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
    phone.screenshot(path=str(ARTIFACTS / "phone-aspect.png"), full_page=True)
    phone.close()
