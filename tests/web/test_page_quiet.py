"""A page never shows an error to a visitor who did nothing wrong (issue 48: every page load showed "Error (2): Please
enter a prompt.", the APIs' hidden events run on load). In Chromium, on the page as `python app.py` serves it on
localhost (the APIs attached, the browsers' history on, so it has tabs): no error or warning toast after the load,
after a Generate, after Stop (idle and mid-request), after each tab switch.

Every toast the tab ever shows is recorded by a script that runs before the page's own (a toast that came and went
still counts).
"""

from __future__ import annotations

import time

import pytest
from conftest import LONG, TIMEOUT_MS, needs_chromium, open_advanced, served, set_steps

pytestmark = [pytest.mark.browser, needs_chromium]

#: Records each toast the page shows (its type and text) in `window.__toasts`, from before the app mounts.
RECORD_TOASTS = """
window.__toasts = [];
new MutationObserver(() => {
  for (const toast of document.querySelectorAll('.toast-body:not([data-seen])')) {
    toast.setAttribute('data-seen', '1');
    const type = [...toast.classList].find((c) => ['error', 'warning', 'info', 'success'].includes(c)) || '';
    window.__toasts.push({type, text: toast.innerText.trim()});
  }
}).observe(document, {childList: true, subtree: true});
"""


@pytest.fixture(scope="module")
def app_page(ui_engine, tmp_path_factory):
    """The page as `python app.py` serves it on localhost: the APIs on, the visitors' history in their browsers."""
    from web.apis import ApiAccess
    from web.history.tab import History

    history = History.for_server(tmp_path_factory.mktemp("data"), logins=False, max_entries=10)
    with served(ui_engine, history=history, apis=ApiAccess(host="127.0.0.1")) as page:
        yield page


class InFlight:
    """The tab's requests still open (a queued event's stream stays open until it has answered).

    The session's event stream (`/queue/data`) counts as answered once the server has handed it every answer it
    waits for (web/gradio_internals.answers_delivered): Gradio's JS client sometimes keeps that stream open after a
    request that ended early, with nothing left to come (gradio-app/gradio#11432 describes it; here the server's threads
    were idle for the 180 s the test once waited)."""

    def __init__(self, page, blocks) -> None:
        self.page, self.blocks = page, blocks
        self.open: set = set()
        # Gradio's heartbeat stream stays open as long as the tab does: not a request that answers.
        page.on("request", lambda r: "/heartbeat/" in r.url or self.open.add(r))
        page.on("requestfinished", lambda r: self.open.discard(r))
        page.on("requestfailed", lambda r: self.open.discard(r))

    def settle(self, quiet_s: float = 1.0, timeout_s: float = TIMEOUT_MS / 1000) -> None:
        """Wait until no request has been open for `quiet_s` (whatever the last action started has answered)."""
        deadline, quiet_since = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline:
            self.page.wait_for_timeout(100)  # lets Playwright deliver the request events
            if self._waiting():
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= quiet_s:
                return
        raise AssertionError(f"requests still open after {timeout_s} s: {[r.url for r in self.open]}")

    def _waiting(self) -> bool:
        """Some request still waits for its answer (the event stream: as the server sees it)."""
        from web.gradio_internals import answers_delivered

        return any("/queue/data" not in r.url for r in self.open) or (
            bool(self.open) and not answers_delivered(self.blocks)
        )


def bad_toasts(page) -> list[dict]:
    return [t for t in page.evaluate("window.__toasts") if t["type"] in ("error", "warning")]


def test_no_error_toast_after_load_generate_stop_and_tab_switches(app_page, browser):
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.add_init_script(RECORD_TOASTS)
    requests = InFlight(page, app_page.demo)
    page.goto(app_page.local_url, timeout=TIMEOUT_MS)
    page.locator("#prompt textarea").wait_for(timeout=TIMEOUT_MS)
    requests.settle()  # whatever the load started has answered
    assert bad_toasts(page) == [], "after load"
    assert app_page.handlers.running == 0  # and nothing was queued behind the visitor's back

    page.locator("#stop").click()  # Stop with nothing running
    requests.settle()
    assert bad_toasts(page) == [], "after Stop with nothing running"

    page.locator("#prompt textarea").fill("a paper boat")
    page.locator("#generate").click()
    page.locator("#status").get_by_text("images in").wait_for(timeout=TIMEOUT_MS)
    requests.settle()  # the PNG follow-up too
    assert bad_toasts(page) == [], "after Generate"

    open_advanced(page)
    set_steps(page, LONG)
    page.locator("#generate").click()
    page.wait_for_function("() => /step \\d+ \\/ 100/.test(document.body.innerText)", timeout=TIMEOUT_MS)
    page.locator("#stop").click()
    page.locator("#status").get_by_text("Stopped at step").or_(
        page.locator("#status").get_by_text(f"{LONG} steps")
    ).wait_for(timeout=TIMEOUT_MS)
    requests.settle()
    assert bad_toasts(page) == [], "after Stop mid-request"

    for name in ("History", "Generate", "History", "Generate"):
        page.get_by_role("tab", name=name).click()
        page.wait_for_function(
            "(n) => [...document.querySelectorAll('[role=tab][aria-selected=true]')]"
            ".some((t) => t.innerText.trim() === n)",
            arg=name,
            timeout=TIMEOUT_MS,
        )
        requests.settle()
        assert bad_toasts(page) == [], f"after switching to {name}"
    page.close()
