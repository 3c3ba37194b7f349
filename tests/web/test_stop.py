"""Stop: a cancelled API job (`job.cancel()`), the page's Stop button and a closed tab end a request at its next
step and free the queue (web/page/sessions.py, the host loop); a tab's images after a Stop still load.

Against the page around the session's `ui_engine` (tiny model, 4 steps by default, progress on), through
gradio_client and Debian's Chromium.
"""

from __future__ import annotations

import time

import pytest
from conftest import GALLERY_LOADS, LONG, TIMEOUT_MS, needs_chromium, open_advanced, set_steps, stop_then_generate


def test_cancel_through_the_client_stops_at_the_next_step_and_frees_the_queue(ui_page, ui_client, ui_engine):
    from gradio_client import Client

    # A client that fetches the previews reads the stream behind its downloads (seen: seconds), so its cancel could
    # come after the request's end; this one fetches none.
    stopper = Client(ui_page.local_url, verbose=False, download_files=False)
    job = stopper.submit(prompt="a castle", steps=LONG, api_name="/generate")
    while True:
        data = job.status().progress_data
        if data and data[0].index is not None and data[0].index >= 2:
            break
        assert not job.done(), "the request ended before it could be cancelled"
        time.sleep(0.005)
    job.cancel()
    gallery, _, status = ui_client.predict(prompt="a castle", steps=2, api_name="/generate")  # the next request runs
    assert len(gallery) == 8 and "2 steps" in status
    # The newest run of LONG steps (recent_runs keeps the last 32 of this worker's, so no index is stable).
    cancelled = next(run for run in reversed(ui_engine.recent_runs) if run["steps"] == LONG)
    assert cancelled["stopped"] and 2 <= cancelled["done"] < LONG  # stopped between steps, well before the end


# ---- in the browser -----------------------------------------------------------------------------------------------


@pytest.mark.browser
@needs_chromium
def test_images_after_a_stop_load_in_the_same_tab(ui_page, browser, ui_engine):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    loads = stop_then_generate(page, ui_page.local_url, "4 steps")
    assert len(loads) == ui_engine.num_images
    assert all(status == 200 and decoded for status, decoded in loads), loads
    set_steps(page, 3)  # and every later request of that tab
    page.locator("#generate").click()
    page.locator("#status").get_by_text("3 steps").wait_for(timeout=TIMEOUT_MS)
    loads = page.evaluate(GALLERY_LOADS)
    assert loads and all(status == 200 and decoded for status, decoded in loads), loads
    page.close()


@pytest.mark.browser
@needs_chromium
def test_closing_the_tab_stops_its_request(ui_page, browser, ui_engine):
    page = browser.new_page()
    page.goto(ui_page.local_url, timeout=TIMEOUT_MS)
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
