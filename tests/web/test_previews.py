"""Live previews: /generate streams the pictures forming every 2 steps when asked (gradio_client's `job.outputs()`),
its answer is unchanged, a caller who leaves the defaults, /generate_png and --no-previews get none, a stop puts the
previous images back, and the page shows them in the gallery (Chromium, screenshot in artifacts/browser/).

Against the page around the session's `ui_engine` (tiny model, progress on).
"""

from __future__ import annotations

import time

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
    served,
    set_steps,
)

from bench.cpu.program_times import ProgramTimer
from web.page.size_labels import size_label

WIDE = size_label(*UI_SIZES[1])  # "224×128 (16:9)"


def _captions(output) -> list[str]:
    gallery = output[0]
    return [item.get("caption") or "" for item in gallery] if isinstance(gallery, list) else []


def test_generate_streams_previews_then_the_same_answer(ui_client, ui_engine):
    job = ui_client.submit(
        prompt="a lantern in the fog", seed=11, randomize_seed=False, steps=8, previews=True, api_name="/generate"
    )
    gallery, seed, status = job.result()
    outputs = job.outputs()
    previews, answer = outputs[:-1], outputs[-1]
    # The engine makes a preview every 2 steps; the handler hands Gradio the newest, so on a loaded machine one that
    # was not taken yet is replaced by the next (web/page/handlers.py): those that arrive come in order, none repeated.
    steps = [_captions(p)[0].split(" · ")[0] for p in previews]
    expected = ["step 2 / 8", "step 4 / 8", "step 6 / 8"]
    assert steps and set(steps) <= set(expected) and steps == sorted(set(steps), key=expected.index), steps
    for preview in previews:
        assert len(preview[0]) == ui_engine.num_images
        assert all(caption.startswith("step ") for caption in _captions(preview))
    assert seed == 11 and "8 steps" in status and len(gallery) == ui_engine.num_images
    assert all(caption.startswith("seed ") for caption in _captions(answer))
    # Not a preview in the answer: the same request through /generate_png streams nothing before its PNGs.
    job = ui_client.submit(
        prompt="a lantern in the fog", seed=11, randomize_seed=False, steps=8, api_name="/generate_png"
    )
    job.result()
    assert len(job.outputs()) == 1


def test_an_api_caller_asks_for_no_previews_and_the_devices_run_none(ui_client, ui_engine):
    with ProgramTimer(ui_engine.programs) as timer:
        job = ui_client.submit(
            prompt="a lantern in the fog", seed=11, randomize_seed=False, steps=8, previews=False, api_name="/generate"
        )
        gallery, seed, _ = job.result()
    assert len(job.outputs()) == 1 and seed == 11 and len(gallery) == ui_engine.num_images
    assert not [label for label in timer.labels if label.startswith("preview")] and timer.labels


def test_a_caller_who_leaves_the_defaults_gets_no_previews_and_fetches_each_image_once(
    ui_client, ui_engine, monkeypatch
):
    """Previews are for eyes: the API's default is none (the page's Generate asks for them)."""
    fetched: list[str] = []
    endpoint = ui_client.endpoints[ui_client._infer_fn_index("/generate", None)]
    fetch = endpoint._download_file
    monkeypatch.setattr(endpoint, "_download_file", lambda x: fetched.append(x["path"]) or fetch(x))
    info = ui_client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    assert next(p for p in info if p["parameter_name"] == "previews")["parameter_default"] is False
    with ProgramTimer(ui_engine.programs) as timer:
        job = ui_client.submit(
            prompt="a lantern in the fog", seed=13, randomize_seed=False, steps=8, api_name="/generate"
        )
        gallery, seed, _ = job.result()
    assert len(job.outputs()) == 1 and seed == 13 and len(gallery) == ui_engine.num_images
    assert all(caption.startswith("seed ") for caption in _captions(job.outputs()[0]))
    assert not [label for label in timer.labels if label.startswith("preview")] and timer.labels
    assert len(fetched) == len(set(fetched)) == ui_engine.num_images


def test_without_previews_each_image_is_fetched_once_and_a_cancel_still_stops_it(ui_client, ui_engine, monkeypatch):
    # gradio_client fetches every file of every message; a generator's answer comes twice (streamed, then as the
    # answer), so a call without previews is answered by the plain twin (web/serving/twin_routing.py): one message.
    fetched: list[str] = []
    for api_name in ("/generate", "/generate_png"):
        endpoint = ui_client.endpoints[ui_client._infer_fn_index(api_name, None)]
        fetch = endpoint._download_file
        monkeypatch.setattr(endpoint, "_download_file", lambda x, fetch=fetch: fetched.append(x["path"]) or fetch(x))
    gallery, seed, status = ui_client.predict(
        prompt="a lantern in the fog", seed=12, randomize_seed=False, steps=4, previews=False, api_name="/generate"
    )
    assert seed == 12 and "4 steps" in status and len(gallery) == ui_engine.num_images
    assert len(fetched) == len(set(fetched)) == ui_engine.num_images
    fetched.clear()
    ui_client.predict(prompt="a lantern in the fog", seed=12, randomize_seed=False, steps=4, api_name="/generate_png")
    assert len(fetched) == len(set(fetched)) == ui_engine.num_images
    # The twin is stopped by job.cancel() as /generate is: between two steps, the queue free for the next request.
    job = ui_client.submit(prompt="a castle", steps=LONG, previews=False, api_name="/generate")
    while not ((data := job.status().progress_data) and data[0].index is not None and data[0].index >= 2):
        assert not job.done(), "the request ended before it could be cancelled"
        time.sleep(0.005)
    job.cancel()
    _, _, status = ui_client.predict(prompt="a castle", steps=2, previews=False, api_name="/generate")
    assert "2 steps" in status
    cancelled = next(run for run in reversed(ui_engine.recent_runs) if run["steps"] == LONG)
    assert cancelled["stopped"] and 2 <= cancelled["done"] < LONG


def test_a_cancel_mid_stream_ends_it_and_the_next_request_streams_its_own(ui_client):
    job = ui_client.submit(prompt="a castle", steps=LONG, previews=True, api_name="/generate")
    deadline = time.monotonic() + 120
    while len(job.outputs()) < 2:  # two previews in: the request is under way
        assert not job.done() and time.monotonic() < deadline, "the request ended before it could be cancelled"
        time.sleep(0.01)
    job.cancel()
    seen = [_captions(o)[0] for o in job.outputs()]
    assert all(caption.endswith("· 64×64") and caption.startswith("step ") for caption in seen)
    assert all(f" / {LONG} " in caption for caption in seen)
    job = ui_client.submit(prompt="a castle", steps=6, previews=True, api_name="/generate")
    job.result()
    # Its own previews, in order: steps 2 and 4 of 6. Only the newest is handed on, and one not taken before the run
    # ends gives way to the answer (handlers.LatestPreview): on a loaded machine step 4's may be dropped, or step 2's
    # replaced by step 4's (CI saw ["step 2 / 6"] once).
    shown = [_captions(o)[0].split(" · ")[0] for o in job.outputs()[:-1]]
    assert shown and shown == sorted(shown) and set(shown) <= {"step 2 / 6", "step 4 / 6"}, shown


def test_no_previews_server_streams_only_the_answer(tiny_dir, tmp_path):
    from gradio_client import Client

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(str(tiny_dir), height=64, width=64, steps=4, dtype="float32", previews=False)
    generator.warmup()
    assert all(key.kind != "preview" for key in generator.program_keys())
    with served(generator) as page:
        client = Client(page.local_url, verbose=False, download_files=str(tmp_path))
        job = client.submit(prompt="a red kite", steps=8, previews=True, api_name="/generate")  # asked: still none
        job.result()
        assert len(job.outputs()) == 1


#: [natural width, shown width] of each gallery image, once loaded.
IMAGE_SIZES_JS = """async () => Promise.all([...document.querySelectorAll('#gallery img')].map(async (img) => {
    if (!img.complete) await new Promise((done) => { img.onload = img.onerror = done; });
    return [img.naturalWidth, Math.round(img.getBoundingClientRect().width)];
}))"""


@pytest.mark.browser
@needs_chromium
def test_the_page_shows_the_pictures_forming_and_a_stop_restores_the_last_images(ui_page, browser):
    for _ in range(3):  # a tab whose first request Stop reached (a loaded machine can end it first: a new tab)
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(ui_page.local_url, timeout=TIMEOUT_MS)
        open_advanced(page)
        choose_size(page, WIDE)  # 2.4× the steps' work of 64×64: Stop lands sooner in the request
        set_steps(page, LONG)
        page.locator("#prompt textarea").fill("a paper boat")
        # The tab's first request stopped: no earlier images to go back to, so its last preview stays (not emptied).
        if stopped := generate_and_stop(page, tries=1):
            break
        page.close()
    else:
        pytest.fail(f"Stop never reached a {LONG}-step request in 3 tries")
    assert "The pictures are its last preview." in stopped.status
    assert page.locator("#gallery img").count() > 0 and "step " in page.locator("#gallery").inner_text()
    set_steps(page, 4)
    page.locator("#generate").click()
    page.locator("#status").get_by_text("4 steps").wait_for(timeout=TIMEOUT_MS)
    done = page.locator("#gallery").inner_text()
    assert "seed " in done and "step " not in done
    set_steps(page, LONG)

    def check_forming() -> None:  # the preview images are visible (the progress overlay is see-through)
        shown = page.evaluate(IMAGE_SIZES_JS)
        assert shown and all(natural > 0 and width >= 100 for natural, width in shown), shown  # upscaled to the cell
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "preview-forming.png"))

    if not (stopped := generate_and_stop(page, forming=check_forming)):
        pytest.fail(f"Stop never reached a {LONG}-step request in 3 tries")
    assert "seed " in stopped.gallery_before  # a try that ran whole leaves its images: those are gone back to
    done = stopped.gallery_before
    page.wait_for_function(
        "() => !/step \\d+ \\/ 100/.test(document.querySelector('#gallery').innerText)", timeout=60_000
    )
    assert page.locator("#gallery").inner_text() == done  # the previous request's images and captions
    page.close()
