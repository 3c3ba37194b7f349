"""The page in a real browser (Debian's chromium via Playwright), and the app embedded in a page on another origin:
eight images, Enter and examples, dark mode and a phone, a refused prompt's toast, the status line and the seed.

Screenshots go to artifacts/browser/ (git-ignored): app.png (desktop, light), app-dark.png, app-phone.png (390 px
wide), newcomer-phone-error.png, newcomer-phone.png and embed.png (the <gradio-app> web component on a page served
from a second local port). Never run `playwright install`: the test uses /usr/bin/chromium and skips when it is
missing.
"""

from __future__ import annotations

import functools
import http.server
import pathlib
import threading

import gradio
import pytest
from conftest import ARTIFACTS, TIMEOUT_MS, free_port, needs_chromium, served

from pipeline.contract.styles import load_examples
from web.page.layout import EXAMPLE_SEED_START

playwright_api = pytest.importorskip("playwright.sync_api")

FRONTEND = pathlib.Path(gradio.__file__).parent / "templates" / "frontend"
PROMPT = "a watercolor fox in a snowy forest"

# Skipped on a developer machine without Chromium; in CI (CI=true) a missing browser fails instead.
pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def app_page(engine):
    """The page around the session's engine (64x64, 2 steps, 8 devices), with the shipped examples."""
    with served(engine) as app_page:
        yield app_page


@pytest.fixture(scope="module", autouse=True)
def artifacts_dir():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


def generate_and_wait(page, root=None) -> None:
    """Type a prompt, press Generate, wait until the gallery shows eight images."""
    scope = root if root is not None else page
    box = scope.locator("#prompt textarea")
    box.fill(PROMPT)
    scope.locator("#generate").click()
    images = scope.locator("#gallery img")
    page.wait_for_function(
        "(root) => (root || document).querySelectorAll('#gallery img').length === 8",
        arg=root.element_handle() if root is not None else None,
        timeout=TIMEOUT_MS,
    )
    images.first.wait_for(state="visible", timeout=TIMEOUT_MS)
    page.wait_for_function(
        "(root) => [...(root || document).querySelectorAll('#gallery img')]"
        ".every(img => img.complete && img.naturalWidth > 0)",
        arg=root.element_handle() if root is not None else None,
        timeout=TIMEOUT_MS,
    )
    status = scope.locator("#status")
    status.get_by_text("8 images in").wait_for(timeout=TIMEOUT_MS)


def test_page_generates_eight_images(app_page, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    page.get_by_text("Running on 8 × cpu").wait_for(timeout=TIMEOUT_MS)
    generate_and_wait(page)
    page.screenshot(path=str(ARTIFACTS / "app.png"), full_page=True)
    # The seed field (in the closed accordion) now holds the seed used, as the status line says.
    page.locator("#advanced").get_by_text("Advanced settings").click()
    seed = page.locator("#seed input")
    seed.wait_for(timeout=30_000)
    assert page.locator("#status").inner_text().strip().endswith(f"seed {seed.input_value()}")
    assert page.locator("#randomize input").is_checked()
    assert not errors, errors
    page.close()


def test_enter_submits_and_examples_fill_prompt(app_page, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    example = load_examples()[0]
    assert not page.get_by_role("tab", name="Generate").is_visible()  # no history: one tab, no tab bar
    page.get_by_text(example, exact=True).first.click()
    box = page.locator("#prompt textarea")
    page.wait_for_function(
        "(text) => document.querySelector('#prompt textarea').value === text", arg=example, timeout=30_000
    )
    box.press("Enter")
    page.wait_for_function("document.querySelectorAll('#gallery img').length === 8", timeout=TIMEOUT_MS)
    page.close()


def test_dark_mode_and_phone_layout(app_page, browser):
    dark = browser.new_page(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    dark.goto(app_page.local_url + "?__theme=dark", timeout=TIMEOUT_MS)
    generate_and_wait(dark)
    dark.locator("#advanced").get_by_text("Advanced settings").click()
    dark.screenshot(path=str(ARTIFACTS / "app-dark.png"), full_page=True)
    dark.close()

    phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    phone.goto(app_page.local_url, timeout=TIMEOUT_MS)
    generate_and_wait(phone)
    # Narrow screen: Generate sits under the prompt, the gallery has two columns.
    prompt_box = phone.locator("#prompt").bounding_box()
    button_box = phone.locator("#generate").bounding_box()
    assert button_box["y"] >= prompt_box["y"] + prompt_box["height"] - 1
    xs = {round(phone.locator("#gallery img").nth(i).bounding_box()["x"]) for i in range(8)}
    assert len(xs) == 2, xs
    phone.screenshot(path=str(ARTIFACTS / "app-phone.png"), full_page=True)
    phone.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        """Say nothing per request: keeps pytest's output clean."""


@pytest.fixture(scope="module")
def embed_site(app_page, tmp_path_factory):
    """A page on another origin that embeds the app with Gradio's web component, served with the JS it needs.

    gradio.js (from the installed package) only does `import("./assets/index-*.js")`, so it is served next to its
    sibling assets/ folder; the bundle then fetches the app's config and queue from the `src` origin (CORS).
    """
    site = tmp_path_factory.mktemp("embed-site")
    (site / "gradio.js").symlink_to(FRONTEND / "gradio.js")
    (site / "assets").symlink_to(FRONTEND / "assets", target_is_directory=True)
    app_url = app_page.local_url.rstrip("/")
    (site / "index.html").write_text(
        f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Host page</title>
<script type="module" src="/gradio.js"></script>
<style>body {{ font-family: sans-serif; margin: 24px; background: #f3f4f6; }}</style></head>
<body><h2>A page on another origin that embeds the app</h2>
<gradio-app src="{app_url}"></gradio-app>
</body></html>
""",
        encoding="utf-8",
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", free_port()), functools.partial(_QuietHandler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_embedded_web_component_works(embed_site, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(embed_site, timeout=TIMEOUT_MS)
    root = page.locator("gradio-app")
    root.get_by_text("Running on 8 × cpu").wait_for(timeout=TIMEOUT_MS)
    generate_and_wait(page, root)
    page.screenshot(path=str(ARTIFACTS / "embed.png"), full_page=True)
    assert not errors, errors  # (Gradio 6.17.3's web component threw `this.app.$destroy is not a function`: #12507)
    page.close()


def test_status_clears_and_examples_leave_randomize_on(app_page, browser, engine):
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    box = page.locator("#prompt textarea")
    box.wait_for(timeout=TIMEOUT_MS)
    page.locator("#advanced").get_by_text("Advanced settings").click()  # the seed box and the checkbox
    box.fill("a watercolor fox")
    page.locator("#generate").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('images in')", timeout=TIMEOUT_MS)
    box.fill("")
    page.locator("#generate").click()
    page.locator(".toast-body").get_by_text("Please enter a prompt.").wait_for(timeout=60_000)
    assert page.locator("#status").inner_text().strip() == ""  # the old request's line is gone
    example = load_examples()[0]
    assert not page.get_by_role("tab", name="Generate").is_visible()  # no history: one tab, no tab bar
    page.get_by_text(example, exact=True).first.click()
    page.wait_for_function(
        "(s) => document.querySelector('#seed input').value === String(s)", arg=EXAMPLE_SEED_START, timeout=TIMEOUT_MS
    )
    assert page.locator("#randomize input").is_checked()  # the next prompt gets a fresh seed
    page.locator("#generate").click()
    page.wait_for_function(
        "(s) => document.querySelector('#status').innerText.includes('images in') && "
        "!document.querySelector('#status').innerText.includes('seed ' + s + '\\n') && "
        "document.querySelector('#seed input').value !== String(s)",
        arg=EXAMPLE_SEED_START,
        timeout=TIMEOUT_MS,
    )
    # Phone width: each caption is whole and under its image (not over it, cut), no blank band below.
    layout = page.evaluate(
        """() => { const items = [...document.querySelectorAll('#gallery .thumbnail-item')];
        const gallery = document.querySelector('#gallery').getBoundingClientRect();
        const cells = items.map(t => { const i = t.querySelector('img').getBoundingClientRect();
          const c = t.querySelector('.caption-label'); const r = c.getBoundingClientRect();
          return {whole: c.scrollWidth <= c.clientWidth + 1, under: r.top >= i.bottom - 1,
                  bottom: t.getBoundingClientRect().bottom}; });
        return {cells, slack: gallery.bottom - Math.max(...cells.map(c => c.bottom))}; }"""
    )
    assert len(layout["cells"]) == engine.num_images
    assert all(c["whole"] and c["under"] for c in layout["cells"]), layout
    assert layout["slack"] < 40, layout
    page.close()


def test_phone_page_error_example_and_layout(app_page, browser):
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    box = page.locator("#prompt textarea")
    box.wait_for(timeout=TIMEOUT_MS)
    # The placeholder fits in the box (measured with the box's own font).
    fits = page.evaluate(
        """(el) => { const s = getComputedStyle(el);
        const c = document.createElement('canvas').getContext('2d');
        c.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
        const room = el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
        return c.measureText(el.placeholder).width <= room; }""",
        box.element_handle(),
    )
    assert fits
    # An empty prompt: the toast says why; no other "Error" badge on the page.
    page.locator("#generate").click()
    page.locator(".toast-body").get_by_text("Please enter a prompt.").wait_for(timeout=60_000)
    badges = "[...document.querySelectorAll('.error')].filter(e => e.offsetWidth && !e.closest('.toast-body'))"
    assert page.evaluate(f"{badges}.length") == 0
    page.screenshot(path=str(ARTIFACTS / "newcomer-phone-error.png"), full_page=True)
    # Images, then an example: the new prompt does not sit above the old prompt's images.
    box.fill("a watercolor fox")
    page.locator("#generate").click()
    page.wait_for_function("document.querySelectorAll('#gallery img').length === 8", timeout=TIMEOUT_MS)
    page.screenshot(path=str(ARTIFACTS / "newcomer-phone.png"), full_page=True)
    old = page.evaluate("[...document.querySelectorAll('#gallery img')].map(i => i.src)")
    example = load_examples()[0]
    assert not page.get_by_role("tab", name="Generate").is_visible()  # no history: one tab, no tab bar
    page.get_by_text(example, exact=True).first.click()
    page.wait_for_function(  # the example's own (cached) images replace the old prompt's
        "([t, old]) => document.querySelector('#prompt textarea').value === t && "
        "[...document.querySelectorAll('#gallery img')].length === 8 && "
        "[...document.querySelectorAll('#gallery img')].every(i => !old.includes(i.src))",
        arg=[example, old],
        timeout=TIMEOUT_MS,
    )
    page.close()
