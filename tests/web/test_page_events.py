"""The page's events as its configuration (what /config serves) lists them: nothing runs on page load (Gradio's
`[id, 'load']` trigger), so no visitor gets a request queued or an error shown before touching anything, with the
APIs' hidden events registered and with either history. Pages are built, not launched (an engine that compiled
nothing: only the configuration is read)."""

from __future__ import annotations

import jax
import pytest
from conftest import TEST_SIZE, TEST_STEPS

from pipeline.generator import Generator
from web.apis import ApiAccess, attach_apis
from web.history.tab import History
from web.page import build_page


@pytest.fixture(scope="module")
def unwarmed():
    """A 1-device tiny generator, nothing compiled: the page only reads its configuration."""
    return Generator.from_pretrained("tiny", height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32",
                                     devices=jax.devices()[:1])  # fmt: skip


def load_triggered(config: dict) -> list[dict]:
    """The dependencies a page load starts: those with a `load` trigger."""
    return [dep for dep in config["dependencies"] if any(event == "load" for _, event in dep["targets"])]


@pytest.mark.parametrize("history", ["off", "browsers", "logins"])
def test_no_event_runs_on_page_load(unwarmed, tmp_path, history):
    made = {"off": History.off, "browsers": lambda: History.for_server(tmp_path, logins=False, max_entries=10),
            "logins": lambda: History.for_server(tmp_path, logins=True, max_entries=10)}[history]()  # fmt: skip
    page = build_page(unwarmed, history=made, logins=history == "logins")
    try:
        queued_events = attach_apis(page, ApiAccess(host="127.0.0.1"))  # the APIs on: their two hidden events
        assert queued_events.get("routes"), "the APIs were not attached"
        config = page.demo.get_config_file()
        groups = {fn_id: fn.concurrency_id for fn_id, fn in page.demo.fns.items()}  # not in the configuration
    finally:
        page.close()
    assert load_triggered(config) == [], [(d["id"], d.get("api_name"), d["targets"]) for d in load_triggered(config)]
    # The APIs' events are there, reachable only by the in-process queue push (web/apis/queue_call.py): no trigger.
    hidden = [dep for dep in config["dependencies"] if groups[dep["id"]] == "generate" and not dep["targets"]]
    assert len(hidden) == 2 and all(dep["api_visibility"] == "private" for dep in hidden), hidden
    # Every event that generates (and so needs a prompt) starts only from something the visitor does: a click or
    # Enter, or the step after one (Vary's generation, an example's).
    for dep in config["dependencies"]:
        if groups[dep["id"]] == "generate":
            assert {event for _, event in dep["targets"]} <= {"click", "submit", "success", "then"}, dep
