"""What the server history costs: the store's calls (web/history/store.py), then `/history` on the launched page.

    python -m bench --only history      # HistoryStore.add per request, list/get/file_of/delete, then /history

The store (a temporary data directory, `max_entries=None`):
  add                ms per `HistoryStore.add` of one request's `--history-images` images at `--history-size`²
                     (photo-like pixels written as the app writes them: gallery JPEG or lossless PNG), durable (files
                     and commit synced) or not, and where the thumbnails come from: the files themselves, the images
                     still in memory, or the JPEGs (what the app does for its PNGs); median, p90
  list               ms for `/history`'s work with `--history-entries` entries of one user: `list(user, n)` and each
                     entry's `as_json()` through json.dumps, for n = 50 and all of them
  get / path_of / delete   ms per call at that size
The endpoint: the page (web.page.layout.build_page around the bench's engine) launched with a login and a server history
(`History.for_server(data_dir, logins=True, max_entries=None)`), one user's history filled to `--history-entries`
entries through its `History.store.add` (small files: a listing never opens them), then `/history` called
`--history-calls` times through gradio_client with that login (limit = the entries, offset 0): ms per call, the
answer's size.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common import Progress, free_port, progress
from .millis import Millis

USER = "measure@example.com"
PASSWORD = "bench-password"  # a login of the bench's own page, in this process only
#: Thumbnail sources compared by the add figures: what is kept, and what its thumbnails are made from.
ADD_VARIANTS = ("jpeg", "png", "png_thumbs_from_memory", "png_thumbs_from_jpeg")


@dataclass(frozen=True)
class HistoryEndpoint:
    entries: int  # the user's entries when timed
    fill_s: float  # filling them through History.store.add (durable, as the page's store is)
    calls: int
    per_call: Millis  # one /history call through gradio_client (limit = entries)
    entries_returned: int
    answer_kb: float  # the JSON answer, as json.dumps writes it


@dataclass(frozen=True)
class HistoryCost:
    entries: int  # one user's entries when listing
    images_per_request: int
    image_size: int  # side in pixels of the added requests' images
    file_kb: dict[str, float]  # mean KB per image: jpeg, png
    add: dict[str, Millis]  # "<variant>_durable" / "<variant>_fast" -> ms per add (see ADD_VARIANTS)
    list_50: Millis  # list(user, 50) + as_json + json.dumps
    list_all: Millis  # the same for every entry
    get: Millis
    path_of: Millis
    delete: Millis
    answer_kb: float  # the store's JSON of every entry (file names, not URLs)
    endpoint: HistoryEndpoint | None  # None when no engine was given
    database: str = "sqlite"  # where the rows were: "sqlite" (the default, in the data directory) or "postgresql"


def request_pil(count: int, size: int) -> list:
    """`count` photo-like images (smooth colour fields plus grain) with their `parameters`, as `generate` returns."""
    from ..engine import describe
    from ..engine import image_files as image_io

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = []
    for index in range(count):
        phase = rng.uniform(0, 6.28, 3)
        field = np.stack([np.sin(6 * x + phase[c]) * np.cos(4 * y - phase[c]) for c in range(3)], axis=-1)
        pixels = np.clip((field * 0.4 + 0.5) * 255 + rng.normal(0, 6, (size, size, 3)), 0, 255).astype(np.uint8)
        text = describe(
            prompt=f"measure {index}",
            negative_prompt="",
            seed=index,
            steps=25,
            guidance_scale=5.0,
            height=size,
            width=size,
            model="tiny",
            dtype="bfloat16",
        )
        images.extend(image_io.to_pil(pixels[None], [text]))
    return images


def request_images(directory: Path, count: int, size: int, image_format: str) -> list[Path]:
    """The same images written as the app writes them ("jpeg": the gallery's, "png": the lossless ones)."""
    from ..engine import image_files as image_io

    return image_io.save_images(request_pil(count, size), directory, f"request-{image_format}", image_format)


def settings(seed: int, size: int) -> dict:
    """An entry's settings (every key /history promises)."""
    return {
        "prompt": f"a lighthouse in a storm, oil painting, number {seed}",
        "negative_prompt": "blurry",
        "seed": seed,
        "steps": 25,
        "sampler": "DPM++ 2M Karras",
        "guidance_scale": 5.0,
        "width": size,
        "height": size,
        "style": "(No style)",
    }


def _ms(action) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def history_cost(
    generator=None,
    *,
    adds: int = 20,
    entries: int = 1000,
    images: int = 4,
    size: int = 1024,
    calls: int = 20,
    database_url: str | None = None,
    say: Progress = progress,
) -> HistoryCost:
    """The store's figures in a temporary data directory (the rows in `database_url` when given: an empty
    PostgreSQL database, as page replicas share); with `generator`, the `/history` endpoint too."""
    from functools import partial

    from web.history.store import HistoryStore

    HistoryStore = partial(HistoryStore, database_url=database_url)  # noqa: N806  # the same calls, either database

    with tempfile.TemporaryDirectory(prefix="bench-history-") as folder:
        directory, sources = Path(folder) / "data", Path(folder) / "sources"
        jpegs, pngs = request_images(sources, images, size, "jpeg"), request_images(sources, images, size, "png")
        file_kb = {
            fmt: sum(p.stat().st_size for p in paths) / len(paths) / 1024
            for fmt, paths in (("jpeg", jpegs), ("png", pngs))
        }
        variants = {
            "jpeg": (jpegs, None),
            "png": (pngs, None),
            "png_thumbs_from_memory": (pngs, request_pil(images, size)),
            "png_thumbs_from_jpeg": (pngs, jpegs),
        }
        seed, add = 0, {}
        for durable in (True, False):
            with HistoryStore(directory, max_entries=None, durable=durable) as store:
                for name in ADD_VARIANTS:
                    paths, thumbnail_sources = variants[name]
                    times = []
                    for _ in range(adds):
                        seed += 1
                        times.append(
                            _ms(
                                lambda s=seed, p=paths, t=thumbnail_sources: store.add(
                                    USER, settings(s, size), p, thumbnail_sources=t
                                )
                            )
                        )
                    add[f"{name}_{'durable' if durable else 'fast'}"] = Millis.of(times)
        say("history: add " + ", ".join(f"{k} {v.median:.0f} ms" for k, v in add.items()))
        small = request_images(sources, 1, 64, "jpeg")
        with HistoryStore(directory, max_entries=None, durable=False) as store:
            while store.count(USER) < entries:  # the rest of the history: small files (listing never opens them)
                seed += 1
                store.add(USER, settings(seed, size), small)
            count = store.count(USER)

            def listing(n: int) -> str:
                return json.dumps([entry.as_json() for entry in store.list(USER, n)])

            list_50 = Millis.of([_ms(lambda: listing(50)) for _ in range(30)])
            list_all = Millis.of([_ms(lambda: listing(count)) for _ in range(30)])
            newest = store.list(USER, 1)[0].id
            get = Millis.of([_ms(lambda: store.get(USER, newest)) for _ in range(200)])
            path_of = Millis.of([_ms(lambda: store.file_of(USER, newest, 0)) for _ in range(200)])
            answer_kb = len(listing(count)) / 1024
            oldest = [entry.id for entry in store.list(USER, 20, offset=count - 20)]
            delete = Millis.of([_ms(lambda i=i: store.delete(USER, i)) for i in oldest])
        say(
            f"history: list 50 {list_50.median:.1f} ms, list {count} {list_all.median:.1f} ms ({answer_kb:.0f} KB), "
            f"get {get.median:.2f} ms, path_of {path_of.median:.2f} ms, delete {delete.median:.1f} ms"
        )
        endpoint = None
        if generator is not None:
            endpoint = history_endpoint(
                generator, Path(folder) / "served", small, entries, calls, size, say, database_url=database_url
            )
    database = "postgresql" if database_url else "sqlite"
    return HistoryCost(
        count, images, size, file_kb, add, list_50, list_all, get, path_of, delete, answer_kb, endpoint, database
    )


def history_endpoint(
    generator,
    data_dir: Path,
    files: list[Path],
    entries: int,
    calls: int,
    size: int,
    say: Progress = progress,
    database_url: str | None = None,
) -> HistoryEndpoint:
    """`/history` of a launched page with logins, its user's history filled to `entries` entries of `files`."""
    from gradio_client import Client

    from web.history.tab import History
    from web.page.layout import build_page

    history = History.for_server(data_dir, logins=True, max_entries=None, database_url=database_url)
    page = build_page(generator, history=history)
    try:
        page.launch(port=free_port(), prevent_thread_lock=True, quiet=True, auth=[(USER, PASSWORD)])
        started = time.perf_counter()
        for seed in range(entries):
            history.store.add(USER, settings(seed, size), files)
        fill_s = time.perf_counter() - started
        with tempfile.TemporaryDirectory(prefix="bench-history-client-") as downloads:
            client = Client(page.local_url, auth=(USER, PASSWORD), verbose=False, download_files=downloads)
            answer = client.predict(entries, 0, api_name="/history")  # untimed: the first call warms up
            times = [_ms(lambda: client.predict(entries, 0, api_name="/history")) for _ in range(calls)]
            answer = client.predict(entries, 0, api_name="/history")
    finally:
        page.close()
    if not isinstance(answer, list):
        raise ValueError(f"/history answered {type(answer).__name__}, not a list of entries")
    result = HistoryEndpoint(entries, fill_s, calls, Millis.of(times), len(answer), len(json.dumps(answer)) / 1024)
    say(
        f"history: /history with {entries} entries: {result.per_call.median:.0f} ms per call through gradio_client, "
        f"{result.entries_returned} entries, {result.answer_kb:.0f} KB (filled in {fill_s:.1f} s)"
    )
    return result


def markdown(cost: HistoryCost | None) -> list[str]:
    if cost is None:
        return []
    rows = [
        f"| {name.rsplit('_', 1)[0]} | {name.rsplit('_', 1)[1]} | {stats.text(1)} |" for name, stats in cost.add.items()
    ]
    lines = [
        f"## Server history ({cost.database}; {cost.images_per_request} images of {cost.image_size}² per request; JPEG "
        f"{cost.file_kb['jpeg']:.0f} KB, PNG {cost.file_kb['png']:.0f} KB per image)",
        "",
        "| kept (thumbnails from) | sync | ms per `add`, median (p90; min–max) |",
        "|---|---|---|",
        *rows,
        "",
        f"| with {cost.entries} entries of one user | ms, median (p90) |",
        "|---|---|",
        f"| list 50 + JSON | {cost.list_50.text(2)} |",
        f"| list {cost.entries} + JSON ({cost.answer_kb:.0f} KB) | {cost.list_all.text(2)} |",
        f"| get | {cost.get.text(3)} |",
        f"| path_of | {cost.path_of.text(3)} |",
        f"| delete | {cost.delete.text(2)} |",
        "",
    ]
    if (ep := cost.endpoint) is not None:
        lines += [
            f"`/history` through gradio_client with a login, {ep.entries} entries (limit {ep.entries}): "
            f"**{ep.per_call.text(0)} ms** per call over {ep.calls} calls; {ep.entries_returned} entries, "
            f"{ep.answer_kb:.0f} KB answer (filled through `History.store.add` in {ep.fill_s:.1f} s).",
            "",
        ]
    return lines
