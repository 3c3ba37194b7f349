"""History kept in a visitor's browser (no login): entries with thumbnails, caps, and distrust of what comes back."""

import json
import stat

import numpy as np
import pytest

from pipeline.contract import image_files as image_io
from web.history.browser import (
    BROWSER_THUMBNAIL_SIZE,
    add_entry,
    browser_entry,
    browser_secret,
    clean_entries,
    delete_entry,
    thumbnail_images,
)

SETTINGS = {
    "prompt": "a red fox",
    "negative_prompt": "",
    "seed": 7,
    "steps": 4,
    "sampler": "Euler",
    "guidance_scale": 5.0,
    "width": 1024,
    "height": 768,
}


@pytest.fixture(scope="module")
def request_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("request")
    pixels = np.random.default_rng(0).integers(0, 256, (2, 768, 1024, 3), dtype=np.uint8)
    images = image_io.to_pil(pixels, ["a red fox\nSteps: 4, Sampler: Euler, Seed: 7"] * 2)
    return [image_io.save_jpeg(images[0], directory / "a.jpg"), image_io.save_png(images[1], directory / "b.png")]


def test_an_entry_round_trips_through_the_browser(request_files):
    entry = browser_entry(SETTINGS, request_files, created=1_700_000_000)
    stored = json.loads(json.dumps(entry))  # what localStorage gives back
    assert clean_entries([stored]) == [entry]
    thumbnails = thumbnail_images(clean_entries([stored])[0])
    assert [image.size for image in thumbnails] == [(BROWSER_THUMBNAIL_SIZE, 120)] * 2
    assert all(len(url) < 40_000 for url in entry["thumbnails"])  # small enough for dozens in localStorage


def test_caps_on_entries_and_characters(request_files):
    entry = browser_entry(SETTINGS, request_files[:1])
    entries = []
    for seed in range(12):
        entries = add_entry(entries, {**entry, "id": f"{seed:016x}"}, max_entries=10)
    assert [e["id"] for e in entries] == [f"{seed:016x}" for seed in range(11, 1, -1)]  # newest first, 10 kept
    size = len(json.dumps(entries[0], separators=(",", ":")))
    assert len(add_entry(entries, entry, max_chars=3 * size + 10)) == 3
    assert len(add_entry([], entry, max_chars=10)) == 1  # the newest always stays
    assert [e["id"] for e in delete_entry(entries, f"{5:016x}")] == [f"{s:016x}" for s in (11, 10, 9, 8, 7, 6, 4, 3, 2)]


def test_what_comes_back_from_a_browser_is_not_trusted(request_files):
    good = browser_entry(SETTINGS, request_files[:1])
    forged = [
        "not an entry",
        {**good, "id": "../../etc"},
        {**good, "thumbnails": ["/etc/passwd"]},  # a server path must never become a gallery file
        {**good, "thumbnails": ["https://example.com/x.jpg"]},  # nor a URL the server would fetch
        {**good, "thumbnails": ["data:image/svg+xml;base64,PHN2Zz4="]},
        {**good, "created": float("nan")},
        {**good, "settings": "prompt"},
    ]
    cleaned = clean_entries([*forged, good, {**good, "settings": {**SETTINGS, "nested": {"a": 1}, 5: "x"}}])
    assert [e["id"] for e in cleaned] == [good["id"], good["id"]]
    assert cleaned[1]["settings"] == SETTINGS  # non-scalar values and non-string keys dropped
    assert clean_entries(None) == [] and clean_entries({"a": 1}) == []
    not_jpeg = {**good, "thumbnails": ["data:image/jpeg;base64,aGVsbG8="]}  # well-formed, but not a JPEG
    assert thumbnail_images(clean_entries([not_jpeg])[0]) == []


def test_the_secret_survives_a_restart(tmp_path):
    first = browser_secret(tmp_path / "data")
    assert browser_secret(tmp_path / "data") == first and len(first) >= 40
    assert stat.S_IMODE((tmp_path / "data" / "browser-state-secret").stat().st_mode) == 0o600
    assert browser_secret(tmp_path / "other") != first


def test_requests_finishing_close_together_are_both_kept(request_files):
    """The follow-up of a request that finished right after another may carry the browser's list from before the
    first's was stored: each follow-up offers every finished request the list lacks, so neither is lost; a request
    the list shows, or one deleted, is not offered again."""
    from types import SimpleNamespace

    from pipeline.contract.request import parse_request
    from web.history.tab import BrowserHistory
    from web.page.handlers import Finished

    history = BrowserHistory(secret="s" * 32)
    tab = SimpleNamespace(session_hash="tab-1")

    def finished(seed: int) -> Finished:
        result = SimpleNamespace(sampler="Euler", seeds=[seed], steps=4)
        return Finished(
            parse_request("a red fox", seed=seed), result, SimpleNamespace(gallery=request_files[:1]), "tab-1", None
        )

    history.keep(finished(1))
    history.keep(finished(2))  # answered before the first's follow-up ran
    first = history.remember_in_browser([], tab)
    stale = history.remember_in_browser([], tab)  # the second's follow-up, with the list from before
    assert [entry["settings"]["seed"] for entry in first] == [2, 1] == [entry["settings"]["seed"] for entry in stale]
    assert [entry["id"] for entry in first] == [entry["id"] for entry in stale]  # the same entries, not copies
    assert history.remember_in_browser(first, tab) == first  # shown in the list: nothing more to add
    history.keep(finished(3))
    third = history.remember_in_browser(first, tab)
    assert [entry["settings"]["seed"] for entry in third] == [3, 2, 1]
    assert history._delete(third[0]["id"], [], tab) == []  # deleted before its list came back: not offered again
    assert history.remember_in_browser([], tab) == []
    history.keep(finished(4))
    history._delete_all([], tab)
    assert history.remember_in_browser([], SimpleNamespace(session_hash="tab-2")) == []  # another tab's: nothing
    assert history.remember_in_browser([], tab) == []
