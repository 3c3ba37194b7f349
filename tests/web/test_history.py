"""Past generations through the served page: per login on the server (/history, the owner-only file route, the
History tab), across a restart, with a cap; in the visitor's own browser without logins.

The store's own guarantees (kill mid-write, concurrent writers, the cap's files) are tested in
test_history_store.py; here the page, the API and the browser.
"""

from __future__ import annotations

import re
import threading
from contextlib import closing

import httpx
import pytest
from conftest import (
    ARTIFACTS,
    GALLERY_LOADS,
    LONG,
    TIMEOUT_MS,
    needs_chromium,
    open_advanced,
    open_section,
    served,
    set_steps,
)
from gradio_client import Client

USERS = [("ann", "ann-secret"), ("bob", "bob-secret")]


def _history_page(engine, data_dir, *, logins=True, max_entries=None):
    from web.history.tab import History

    history = History.for_server(data_dir, logins=logins, max_entries=max_entries)
    return served(engine, auth=USERS if logins else None, history=history)


def _signed_in(url: str, user: str, password: str) -> httpx.Client:
    """An HTTP client holding `user`'s login cookie (what a browser holds)."""
    client = httpx.Client(base_url=url, timeout=60)
    assert client.post("login", data={"username": user, "password": password}).status_code == 200
    return client


def test_history_per_login_across_a_restart_and_no_cross_user_access(ui_engine, tmp_path):
    data = tmp_path / "data"
    with _history_page(ui_engine, data) as page:
        ann, bob = (
            Client(page.local_url, auth=user, verbose=False, download_files=str(tmp_path / user[0])) for user in USERS
        )
        ann.predict("a lighthouse", seed=3, randomize_seed=False, steps=3, api_name="/generate")
        ann.predict(
            "a windmill", "fog", seed=4, randomize_seed=False, steps=2, guidance_scale=6, api_name="/generate_png"
        )
        bob.predict("a teapot", seed=9, randomize_seed=False, steps=2, api_name="/generate")
        mine, theirs = ann.predict(api_name="/history"), bob.predict(api_name="/history")
        assert [e["prompt"] for e in mine] == ["a windmill", "a lighthouse"]  # newest first
        assert [e["prompt"] for e in theirs] == ["a teapot"]
        newest = mine[0]
        assert {
            k: newest[k] for k in ("negative_prompt", "seed", "steps", "sampler", "guidance_scale", "width", "height")
        } == {
            "negative_prompt": "fog",
            "seed": 4,
            "steps": 2,
            "sampler": "Euler",
            "guidance_scale": 6.0,
            "width": 64,
            "height": 64,
        }
        assert newest["created"].endswith("Z") and len(newest["images"]) == ui_engine.num_images
        # The files: ann's own with her login; a 404 for bob and for nobody, alike for an id that does not exist.
        with (
            closing(_signed_in(page.local_url, *USERS[0])) as ann_http,
            closing(_signed_in(page.local_url, *USERS[1])) as bob_http,
        ):
            image = ann_http.get(newest["images"][0])
            assert image.status_code == 200 and image.content[:8] == b"\x89PNG\r\n\x1a\n"
            assert b"parameters" in image.content and b"a windmill" in image.content  # the PNG with its settings
            assert ann_http.get(newest["thumbnails"][0]).headers["content-type"] == "image/jpeg"
            for url in (newest["images"][0], newest["thumbnails"][0]):
                assert bob_http.get(url).status_code == 404
                assert httpx.get(url).status_code == 404
            missing = newest["images"][0].replace(f"/{newest['id']}/", "/999999/")
            assert ann_http.get(missing).status_code == 404
            # Gradio's own file route does not reach the data folder either.
            assert ann_http.get(f"/gradio_api/file={data}/history.sqlite3").status_code in (403, 404)
    # A restart on the same folder: everything is still there, still per login.
    with _history_page(ui_engine, data) as page:
        ann, bob = (
            Client(page.local_url, auth=user, verbose=False, download_files=str(tmp_path / user[0])) for user in USERS
        )
        assert [e["id"] for e in ann.predict(api_name="/history")] == [e["id"] for e in mine]
        assert [e["prompt"] for e in bob.predict(api_name="/history")] == ["a teapot"]
        with closing(_signed_in(page.local_url, *USERS[0])) as ann_http:
            assert ann_http.get(ann.predict(api_name="/history")[0]["images"][1]).status_code == 200


def test_the_cap_and_two_requests_finishing_together(ui_engine, tmp_path):
    with _history_page(ui_engine, tmp_path / "data", max_entries=3) as page:
        clients = [
            Client(page.local_url, auth=USERS[0], verbose=False, download_files=str(tmp_path / str(i)))
            for i in range(2)
        ]
        threads = [
            threading.Thread(target=client.predict, args=(f"a kite {i}",), kwargs={"steps": 2, "api_name": "/generate"})
            for i, client in enumerate(clients)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        entries = clients[0].predict(api_name="/history")
        assert sorted(e["prompt"] for e in entries) == ["a kite 0", "a kite 1"]  # both landed
        for i in range(2, 5):
            clients[0].predict(f"a kite {i}", steps=2, api_name="/generate")
        entries = clients[0].predict(api_name="/history")
        assert [e["prompt"] for e in entries] == ["a kite 4", "a kite 3", "a kite 2"]  # the oldest two pruned
        store = page.history.store
        folders = list((store.directory / "files").glob("*/*"))
        assert len(folders) == 3  # their files went with them
        assert clients[0].predict(limit=2, offset=1, api_name="/history")[0]["prompt"] == "a kite 3"


def test_without_logins_the_server_keeps_nothing(ui_engine, tmp_path):
    data = tmp_path / "data"
    with _history_page(ui_engine, data, logins=False) as page:
        client = Client(page.local_url, verbose=False, download_files=str(tmp_path / "client"))
        client.predict("a lighthouse", steps=2, api_name="/generate")
        with pytest.raises(Exception, match="keeps no history"):
            client.predict(api_name="/history")
    assert sorted(p.name for p in data.iterdir()) == ["browser-state-secret"]  # only the browsers' key


def test_no_history_means_no_tab_and_no_endpoint(ui_page):
    config = httpx.get(f"{ui_page.local_url}config").json()
    assert all(c["props"].get("elem_id") != "history-tab" for c in config["components"])
    client = Client(ui_page.local_url, verbose=False, download_files=False)
    api = client.view_api(print_info=False, return_format="dict")
    assert "/history" not in api["named_endpoints"]


# ---- in the browser -----------------------------------------------------------------------------------------------


def _generate(page, prompt: str, steps: int) -> None:
    set_steps(page, steps)
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate").click()
    page.wait_for_function(
        f"() => document.querySelector('#status').innerText.includes('{steps} steps')", timeout=TIMEOUT_MS
    )


#: The browser's stored history (encrypted by the server's key), or "".
STORED = "(localStorage.getItem('sdxl-jax-history') || '')"


def _open_history(page, count: int) -> None:
    page.get_by_role("tab", name="History").click()
    try:
        page.wait_for_function(
            f"() => document.querySelectorAll('#history-gallery img').length === {count}", timeout=TIMEOUT_MS
        )
    except Exception:  # say what the tab shows instead of only that the wait timed out
        shown = page.evaluate("() => document.querySelectorAll('#history-gallery img').length")
        summary = page.locator("#history-summary").inner_text()
        raise AssertionError(f"the History tab shows {shown} images, not {count}; its summary: {summary!r}") from None


def _signed_in_tab(browser, url: str):
    """A fresh browser context (closed by the caller: the module's browser stays) and its tab, signed in as ann."""
    context = browser.new_context(viewport={"width": 1200, "height": 1000})
    page = context.new_page()
    page.goto(url, timeout=TIMEOUT_MS)
    page.locator("input").first.fill(USERS[0][0])
    page.locator("input[type=password]").fill(USERS[0][1])
    page.locator("button").filter(has_text="Login").click()
    page.locator("#prompt textarea").wait_for(timeout=TIMEOUT_MS)
    return context, page


@pytest.mark.browser
@needs_chromium
def test_history_tab_with_logins_use_and_delete(ui_engine, browser, tmp_path):
    with _history_page(ui_engine, tmp_path / "data") as served_page:
        context, page = _signed_in_tab(browser, served_page.local_url)
        open_advanced(page)
        _generate(page, "a kite over the dunes", 3)
        _generate(page, "a blue house", 2)
        _open_history(page, 2)
        loads = page.evaluate("""async () => Promise.all([...document.querySelectorAll('#history-gallery img')]
            .map(async (img) => { if (!img.complete) await new Promise((d) => { img.onload = img.onerror = d; });
                                  return img.naturalWidth; }))""")
        assert all(width > 0 for width in loads), loads  # the owner-only route serves this login's thumbnails
        page.locator("#history-gallery img").nth(1).click()  # the older: the kite
        page.locator("#history-details").get_by_text("a kite over the dunes").wait_for(timeout=TIMEOUT_MS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "history-tab.png"), full_page=True)
        page.locator("#history-use").click()
        page.wait_for_function(
            "() => document.querySelector('#prompt textarea').value === 'a kite over the dunes'", timeout=TIMEOUT_MS
        )
        assert page.locator("#steps input[type=number]").input_value() == "3"
        assert not page.locator("#randomize input").is_checked()  # the entry's seed is meant to be used
        _open_history(page, 2)
        page.locator("#history-gallery img").nth(0).click()
        page.locator("#history-details").get_by_text("a blue house").wait_for(timeout=TIMEOUT_MS)
        page.locator("#history-delete").click()
        page.wait_for_function(
            "() => document.querySelectorAll('#history-gallery img').length === 1", timeout=TIMEOUT_MS
        )
        page.locator("#history-delete-all").click()
        page.locator("#history-delete-all-yes").click()
        page.locator("#history-summary").get_by_text("Nothing yet").wait_for(timeout=TIMEOUT_MS)
        assert served_page.history.store.count(USERS[0][0]) == 0
        context.close()


@pytest.mark.browser
@needs_chromium
def test_history_without_logins_stays_in_the_browser(ui_engine, browser, tmp_path):
    with _history_page(ui_engine, tmp_path / "data", logins=False) as served_page:
        context = browser.new_context(viewport={"width": 1200, "height": 1000})
        page = context.new_page()
        page.goto(served_page.local_url, timeout=TIMEOUT_MS)
        open_advanced(page)
        _generate(page, "a kite over the dunes", 3)
        page.wait_for_function(f"() => ({STORED}).length > 1000", timeout=TIMEOUT_MS)
        first = page.evaluate(f"() => {STORED}")
        _generate(page, "a blue house", 2)
        # The second request's follow-up stores it after its answer: wait for the stored list to change, not only
        # for it to exist (the first entry alone fills it; the tab opened before the second was stored shows 1).
        page.wait_for_function(f"(first) => {STORED} !== first", arg=first, timeout=TIMEOUT_MS)
        stored = page.evaluate(f"() => {STORED}")
        # Encrypted with the server's key. The whole prompt, spaces and all: a 4-letter word alone turns up in a long
        # base64 ciphertext by chance (CI, 2026-12-06: "kite" inside the blob), a text with spaces never does.
        assert "a kite over the dunes" not in stored
        _open_history(page, 2)
        page.screenshot(path=str(ARTIFACTS / "history-in-browser.png"), full_page=True)
        page.reload()
        _open_history(page, 2)  # still there after a reload
        other_context = browser.new_context()  # another visitor: nothing
        other = other_context.new_page()
        other.goto(served_page.local_url, timeout=TIMEOUT_MS)
        other.get_by_role("tab", name="History").click()
        other.locator("#history-summary").get_by_text("Nothing yet").wait_for(timeout=TIMEOUT_MS)
        page.locator("#history-gallery img").nth(1).click()
        page.locator("#history-details").get_by_text("a kite over the dunes").wait_for(timeout=TIMEOUT_MS)
        page.locator("#history-use").click()
        page.wait_for_function(
            "() => document.querySelector('#prompt textarea').value === 'a kite over the dunes'", timeout=TIMEOUT_MS
        )
        other_context.close()
        context.close()


#: The gallery's captions, in order (a plot's: "grid 1 / 1", then each cell's values).
CAPTIONS = "() => [...document.querySelectorAll('#gallery .caption-label')].map((caption) => caption.innerText)"
#: The plot's progress over the gallery says its second cell runs (the first has finished).
SECOND_CELL = "() => /cell 2 \\/ \\d/.test(document.querySelector('#gallery').innerText)"
#: The status line holds a plot's answer that differs from `before` (each answer rewrites it: its time, its seed).
PLOT_ANSWERED = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && /X\\/Y\\/Z plot: /.test(text); }"""


def _choose_axis(page, elem_id: str, label: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=label, exact=True).click()


def _run_plot(page, *, stop: bool = False) -> str:
    """Press "Run plot" (`stop`: then Stop, once its second cell runs) and wait for its answer; the status line."""
    before = page.locator("#status").inner_text()
    page.locator("#xyz-run").click()
    if stop:
        page.wait_for_function(SECOND_CELL, timeout=TIMEOUT_MS)
        page.locator("#stop").click()
    page.wait_for_function(PLOT_ANSWERED, arg=before, timeout=TIMEOUT_MS)
    return page.locator("#status").inner_text()


@pytest.mark.browser
@needs_chromium
def test_an_xyz_plot_on_the_page_is_one_history_entry_and_a_stop_keeps_its_finished_cells(ui_engine, browser, tmp_path):
    """The page's "X/Y/Z plot" section, opened: Steps 2, 3 across, CFG Scale 3, 5 down, "Run plot": the grid then
    the four cells in the gallery (each caption its values), the status line, one history entry of all five images.
    A bad value: one sentence, and the last plot's status line gone. Then a plot of Steps 2 and seven of 100, stopped
    once its second cell runs: the finished cells' answer (the grid and those cells), said so, and kept too. (Stop at
    the Python level: tests/engine/test_xyz_plot.py.)"""
    with _history_page(ui_engine, tmp_path / "data") as served_page:
        context, page = _signed_in_tab(browser, served_page.local_url)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        open_section(page, "xyz-plot", "X/Y/Z plot", "#xyz-x-values textarea")
        assert page.locator("#xyz-x-type input").input_value() == "Steps"
        page.locator("#prompt textarea").fill("a kite over the dunes")
        page.locator("#xyz-x-values textarea").fill("2, 3")
        _choose_axis(page, "xyz-y-type", "CFG Scale")
        page.locator("#xyz-y-values textarea").fill("3, 5")
        status = _run_plot(page)
        assert status.startswith("X/Y/Z plot: 4 of 4 cells in ") and " · 64×64 · seed " in status, status
        cells = [f"Steps: {steps}, CFG Scale: {cfg}" for cfg in (3, 5) for steps in (2, 3)]  # X fastest
        assert page.evaluate(CAPTIONS) == ["grid 1 / 1", *cells]
        assert page.evaluate(GALLERY_LOADS) == [[200, True]] * 5
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "xyz-plot.png"), full_page=True)
        _open_history(page, 1)
        (entry,) = served_page.history.store.list(USERS[0][0])
        assert len(entry.images) == 5 and entry.settings["prompt"] == "a kite over the dunes"

        page.get_by_role("tab", name="Generate").click()
        page.locator("#xyz-x-values textarea").fill("2, two")
        page.locator("#xyz-run").click()
        page.locator(".toast-body").get_by_text("Steps takes numbers; got 'two'.").wait_for(timeout=TIMEOUT_MS)
        assert page.locator("#status").inner_text().strip() == ""  # not the last plot's line, above the refusal
        _choose_axis(page, "xyz-y-type", "Nothing")
        # Seven long cells after the short one: Stop, pressed once the second cell runs, lands in one of them even
        # when a loaded machine's browser sees the progress seconds late (three cells, 13 s, once ran whole so). A
        # plot stopped in time costs no more for them.
        page.locator("#xyz-x-values textarea").fill(", ".join(["2"] + [str(LONG)] * 7))
        status = _run_plot(page, stop=True)
        finished = re.match(r"X/Y/Z plot: (\d) of 8 cells in ", status)
        assert finished and 1 <= int(finished[1]) < 8, status
        assert status.endswith(" · stopped: the cells that finished are shown"), status
        assert page.evaluate(CAPTIONS) == ["grid 1 / 1", "Steps: 2", *[f"Steps: {LONG}"] * (int(finished[1]) - 1)]
        _open_history(page, 2)  # each plot one entry, the stopped one too
        assert not errors, errors
        context.close()


def test_a_history_entry_shows_what_the_status_line_showed():
    """One renderer (pipeline/contract/parameters.status_parts): the schedule type, the levers and the picture's
    strength read the same on the page's status line and in the history entry the request left (the history once
    dropped the schedule type and named the picture otherwise)."""
    from types import SimpleNamespace

    from conftest import FIXTURES

    from pipeline.contract.request import RequestRules, parse_request
    from web.history.tab import _details
    from web.page.form import request_settings

    rules = RequestRules(sizes=((64, 64),), steps=8, levers=True)
    request = parse_request(
        "a cabin",
        init_image=FIXTURES / "image-input.png",
        mask_image=FIXTURES / "image-mask.png",
        strength=0.6,
        schedule_type="Karras",
        cfg_end=0.5,
        rules=rules,
    )
    line = request.status_text()
    assert line == " · CFG end 0.5 · inpainted, strength 0.6 · schedule Karras"
    details = _details(request_settings(request, SimpleNamespace(sampler="Euler")), None)
    assert details.splitlines()[-1] == "- " + line.removeprefix(" · ")
