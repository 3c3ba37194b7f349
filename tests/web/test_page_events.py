"""The page's events as its configuration (what /config serves) lists them: nothing runs on page load (Gradio's
`[id, 'load']` trigger), so no visitor gets a request queued or an error shown before touching anything, with the
APIs' hidden events registered and with either history; Vary is one-shot and a refused Vary touches no input, and the
picture in use shows beside Generate (issue 68). Pages are built, not launched (an engine that compiled nothing: only
the configuration is read)."""

from __future__ import annotations

import jax
import pytest
from conftest import FIXTURES, TEST_SIZE, TEST_STEPS

from pipeline.generator import Generator
from web.apis import ApiAccess, attach_apis
from web.history.tab import History
from web.page.handlers import Handlers
from web.page.layout import build_page


@pytest.fixture(scope="module")
def unwarmed():
    """A 1-device tiny generator, nothing compiled: the page only reads its configuration."""
    return Generator.from_pretrained(
        "tiny", height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", devices=jax.devices()[:1]
    )


def load_triggered(config: dict) -> list[dict]:
    """The dependencies a page load starts: those with a `load` trigger."""
    return [dep for dep in config["dependencies"] if any(event == "load" for _, event in dep["targets"])]


@pytest.mark.parametrize("history", ["off", "browsers", "logins"])
def test_no_event_runs_on_page_load(unwarmed, tmp_path, history):
    made = {
        "off": History.off,
        "browsers": lambda: History.for_server(tmp_path, logins=False, max_entries=10),
        "logins": lambda: History.for_server(tmp_path, logins=True, max_entries=10),
    }[history]()
    page = build_page(unwarmed, history=made, logins=history == "logins")
    try:
        queued_events = attach_apis(page, ApiAccess(host="127.0.0.1"))  # the APIs on: their three hidden events
        assert queued_events.get("routes"), "the APIs were not attached"
        config = page.demo.get_config_file()
        groups = {fn_id: fn.concurrency_id for fn_id, fn in page.demo.fns.items()}  # not in the configuration
    finally:
        page.close()
    assert load_triggered(config) == [], [(d["id"], d.get("api_name"), d["targets"]) for d in load_triggered(config)]
    # The APIs' events are there, reachable only by the in-process queue push (web/apis/queue_call.py): no trigger.
    hidden = [dep for dep in config["dependencies"] if groups[dep["id"]] == "generate" and not dep["targets"]]
    assert len(hidden) == 3 and all(dep["api_visibility"] == "private" for dep in hidden), hidden  # JPEG, PNG, plot
    # Every event that generates (and so needs a prompt) starts only from something the visitor does: a click or
    # Enter, or the step after one (Vary's generation, an example's).
    for dep in config["dependencies"]:
        if groups[dep["id"]] == "generate":
            assert {event for _, event in dep["targets"]} <= {"click", "submit", "success", "then"}, dep


@pytest.fixture(scope="module")
def plain_config(unwarmed) -> dict:
    """The configuration of a page without a history."""
    page = build_page(unwarmed)
    try:
        return page.demo.get_config_file()
    finally:
        page.close()


def by_elem_id(config: dict) -> dict[str, int]:
    return {c["props"]["elem_id"]: c["id"] for c in config["components"] if c["props"].get("elem_id")}


def triggered(config: dict, elem_id: str, event: str) -> list[dict]:
    """The events `event` on `elem_id` triggers."""
    target = (by_elem_id(config)[elem_id], event)
    return [dep for dep in config["dependencies"] if target in [tuple(t) for t in dep["targets"]]]


def chain(config: dict, elem_id: str) -> list[dict]:
    """The events a click on `elem_id` runs: its own, then those after it (`.success`, `.then`), in order."""
    events = triggered(config, elem_id, "click")
    for dep in events:  # grows while it is read
        events += [after for after in config["dependencies"] if after.get("trigger_after") == dep["id"]]
    return events


@pytest.mark.parametrize("button", ["vary-subtle", "vary-strong", "use-picture"])
def test_a_refused_vary_marks_no_input(plain_config, button):
    """Issue 68: a Vary (or "Use as picture") with no gallery image clicked is refused in one sentence, and Gradio
    marks a refused event's outputs with a red "Error" badge (a spinner while it runs): its first event writes
    States only, so the picture, its mask editor and Strength keep what they held, unmarked; what it starts follows
    on success only."""
    states = {c["id"] for c in plain_config["components"] if c["type"] == "state"}
    first, *after = chain(plain_config, button)
    assert first["outputs"] and set(first["outputs"]) <= states, first["outputs"]
    assert first["show_progress"] == "hidden"
    assert after and all(dep["trigger_only_on_success"] for dep in after)


@pytest.mark.parametrize("button", ["vary-subtle", "vary-strong"])
def test_vary_is_one_shot(plain_config, button):
    """Issue 68: Vary's generation takes the clicked result and its strength from States, in place of the picture
    and Strength inputs, and no event of Vary writes those inputs: the next Generate starts from what "Start from a
    picture" held before (shown beside Generate), or from the prompt alone."""
    ids = by_elem_id(plain_config)
    picture_inputs = {ids["init-image"], ids["mask-editor"], ids["strength"]}
    events = chain(plain_config, button)
    assert not [dep["outputs"] for dep in events if picture_inputs & set(dep["outputs"])]
    generation = next(dep for dep in events if ids["gallery"] in dep["outputs"])
    assert generation["trigger_after"] == events[0]["id"] and generation["trigger_only_on_success"]
    assert not picture_inputs & set(generation["inputs"]), "Vary's generation reads the picture's inputs"
    assert set(events[0]["outputs"]) <= set(generation["inputs"])  # the clicked result's PNG and the strength


def test_the_picture_in_use_shows_beside_generate_with_its_cross(plain_config):
    """Issue 68: a chip beside Generate (in the prompt's row, hidden while no picture is in use) shows the picture
    Generate starts from, and its ✕ clears the picture, the mask editor and the chip; an upload and "Use as picture"
    fill all three."""
    ids = by_elem_id(plain_config)
    chip = next(c for c in plain_config["components"] if c["id"] == ids["picture-chip"])
    assert chip["props"]["visible"] is False

    def holds(node: dict, wanted: int) -> bool:
        return node["id"] == wanted or any(holds(child, wanted) for child in node.get("children", []))

    def find(node: dict, wanted: int) -> dict | None:
        if node["id"] == wanted:
            return node
        return next((found for child in node.get("children", []) if (found := find(child, wanted))), None)

    row = find(plain_config["layout"], ids["prompt-row"])
    assert holds(row, ids["picture-chip"]) and holds(row, ids["generate"]) and holds(row, ids["drop-picture"])
    in_use = [ids[name] for name in ("init-image", "mask-editor", "picture-chip", "picture-chip-image")]
    assert [dep["outputs"] for dep in chain(plain_config, "drop-picture")] == [in_use]
    assert chain(plain_config, "use-picture")[-1]["outputs"] == in_use
    # An upload fills the chip and the editor (and redraws the Outpaint choice's grown canvas, its own event)
    changed = [dep["outputs"] for dep in triggered(plain_config, "init-image", "change")]
    assert sorted(changed) == sorted([in_use, [ids["outpaint-canvas"]]]), changed


def test_the_chip_follows_the_picture(tmp_path):
    """The handlers behind the chip: a picture uploaded shows it (the editor gets it to paint on); none, a file that
    is not a picture (one sentence, as a warning) or the ✕ hides it and clears the editor; "Use as picture" shows the
    clicked result's PNG everywhere."""
    import gradio as gr

    picture = str(FIXTURES / "image-input.png")
    kept, editor, chip, thumbnail = Handlers.picture_uploaded({"path": picture})
    assert kept == gr.skip() and editor == Handlers.paint_on(picture)
    assert chip["visible"] is True and thumbnail == picture
    cleared = (None, None, gr.update(visible=False), None)
    assert Handlers.picture_uploaded(None) == cleared and Handlers.drop_picture() == cleared
    not_a_picture = tmp_path / "notes.png"
    not_a_picture.write_text("meeting notes\n")
    with pytest.warns(UserWarning, match="not a picture"):
        assert Handlers.picture_uploaded({"path": str(not_a_picture)}) == cleared
    assert Handlers.use_picture(picture) == (picture, Handlers.paint_on(picture), gr.update(visible=True), picture)
