"""Test set-up: 8 virtual CPU devices stand in for a TPU v5e-8. Set before anything imports JAX."""

import contextlib
import os
import socket
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compiled programs are shared between the tests of a run (and reruns) through JAX's persistent cache.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax")
)

import pytest  # noqa: E402

#: Small enough for 2 CPU cores, large enough to exercise every block: 8x8 latents, 2 Euler steps.
TEST_SIZE = 64
TEST_STEPS = 2


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The tiny random-weight SDXL checkpoint, built once per machine."""
    from pipeline.checkpoint.tiny import tiny_checkpoint

    return tiny_checkpoint()


@pytest.fixture(scope="session")
def engine(tiny_dir):
    """A warmed-up float32 generator on all 8 devices."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32"
    )
    generator.warmup()
    return generator


def free_port() -> int:
    """A TCP port nobody listens on right now, for a server a test launches."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: The UI tests' offered sizes (height, width): square and 16:9 (7:4 like SDXL's 1344x768), multiples of 32.
UI_SIZES = [(TEST_SIZE, TEST_SIZE), (128, 224)]
#: Enough steps to watch a progress bar move.
UI_STEPS = 4


@pytest.fixture(scope="session")
def ui_engine(tiny_dir):
    """A warmed-up generator with live progress and two sizes (compiled once, shared by the UI test files)."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), steps=UI_STEPS, dtype="float32", sizes=UI_SIZES, progress=True,
        height=UI_SIZES[0][0], width=UI_SIZES[0][1],
    )  # fmt: skip
    generator.warmup()
    return generator


@contextlib.contextmanager
def served(generator, **build_kwargs):
    """The app's page around `generator`, launched on a free port in this process; closed afterwards."""
    import app

    demo = app.build_demo(generator, **build_kwargs)
    app.launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield demo
    finally:
        app.close_demo(demo)


@pytest.fixture(scope="module")
def ui_demo(ui_engine):
    """The app around `ui_engine`, one per test file that asks for it."""
    with served(ui_engine) as demo:
        yield demo


@pytest.fixture(scope="module")
def ui_client(ui_demo, tmp_path_factory):
    """A gradio_client for `ui_demo`, downloading into a temporary folder."""
    from gradio_client import Client

    return Client(ui_demo.local_url, verbose=False, download_files=str(tmp_path_factory.mktemp("downloads")))


@contextlib.contextmanager
def headless_chromium():
    """Debian's Chromium through Playwright (never `playwright install`)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser
        finally:
            browser.close()


# ---- the page in a browser ------------------------------------------------------------------------------------------

TIMEOUT_MS = 180_000
LONG = 100  # steps of a request that gets stopped: long enough to press Stop in the middle


def open_advanced(page) -> None:
    page.locator("#advanced").get_by_text("Advanced settings").click()


def set_steps(page, steps: int) -> None:
    box = page.locator("#steps input[type=number]")
    box.fill(str(steps))
    box.press("Enter")


#: Each gallery image of the page: (HTTP status of its file, whether the browser decoded it).
GALLERY_LOADS = """async () => Promise.all([...document.querySelectorAll('#gallery img')].map(async (img) => {
    if (!img.complete) await new Promise((done) => { img.onload = img.onerror = done; });
    return [(await fetch(img.src)).status, img.naturalWidth > 0];
}))"""


def stop_then_generate(page, url: str, done_text: str) -> list:
    """Steps 100, Generate, Stop, steps 4, Generate: the sequence that once broke a tab's images (issue 26)."""
    page.goto(url, timeout=TIMEOUT_MS)
    open_advanced(page)
    set_steps(page, LONG)
    page.locator("#prompt textarea").fill("a kite over the dunes")
    page.locator("#generate").click()
    page.wait_for_function("() => /step ([2-9]|\\d\\d) \\/ 100/.test(document.body.innerText)", timeout=TIMEOUT_MS)
    page.locator("#stop").click()
    page.locator("#status").get_by_text("Stopped at step").wait_for(timeout=60_000)
    set_steps(page, 4)
    page.locator("#generate").click()
    page.locator("#status").get_by_text(done_text).wait_for(timeout=TIMEOUT_MS)
    page.wait_for_function("() => document.querySelectorAll('#gallery img').length > 0", timeout=TIMEOUT_MS)
    return page.evaluate(GALLERY_LOADS)
