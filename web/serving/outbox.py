"""From a request's images to files a browser or an API client fetches: fast ones now, lossless ones soon after.

The gallery's JPEGs are written on the request's path (a few ms per 1024² image, in parallel threads); each image's
lossless PNG with its `parameters` chunk is written by a background pool, so the answer never waits for zlib and the
next request's device work is never queued behind it. The PNGs are found again by the gallery file's name (Gradio
keeps a file's name when it copies it into its cache), which carries a token unique to the run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from pipeline.contract import image_files as image_io

#: Runs whose PNG futures stay findable by name; older ones are forgotten (their files may be gone as well).
KEEP_RUNS = 64
#: Threads writing PNGs in the background: at most this many, and never more than the cores.
PNG_WORKERS = 4
#: Their niceness (Linux sets it per thread): the next request's JPEGs, tokenizing and device calls go first.
PNG_NICENESS = 19


@dataclass(frozen=True)
class Delivery:
    """One run's files."""

    gallery: list[Path]  # the gallery's files (JPEG by default), written before the answer, in image order
    pngs: list[Future]  # Future[Path] of each image's lossless PNG, written in the background, in image order
    host_s: float  # seconds spent on the request's path (encoding and writing the gallery files)


class Outbox:
    """Writes each run's gallery files now and its PNGs in the background; finds a PNG again by gallery file name."""

    def __init__(self, gallery_format: str = image_io.GALLERY_FORMAT, keep_runs: int = KEEP_RUNS) -> None:
        if gallery_format not in image_io.SAVERS:
            raise ValueError(f"unknown gallery format {gallery_format!r}; choose one of {', '.join(image_io.SAVERS)}")
        self.gallery_format = gallery_format
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(PNG_WORKERS, os.cpu_count() or 1)),
            thread_name_prefix="png",
            initializer=_lowest_priority,
        )
        self._runs: collections.OrderedDict[str, dict[str, Future]] = collections.OrderedDict()
        self._keep = keep_runs
        self._lock = threading.Lock()

    def deliver(
        self, images: list[Image.Image], directory: str | Path, stem: str, image_format: str | None = None
    ) -> Delivery:
        """Write `images` as `<stem>-<token>-NN.jpg` now and queue their PNGs (same names, .png) in the background.

        `image_format="png"` writes the PNGs now instead (an API caller asked for them): nothing is left to queue.
        """
        image_format = image_format or self.gallery_format
        token = secrets.token_hex(3)
        stem = f"{stem}-{token}"
        started = time.perf_counter()
        gallery = image_io.save_images(images, directory, stem, image_format)
        host_s = time.perf_counter() - started
        pngs = image_io.image_paths(len(images), directory, stem, "png")
        if image_format == "png":
            futures = [_done(path) for path in gallery]
        else:
            futures = [self._pool.submit(image_io.save_png, im, path) for im, path in zip(images, pngs, strict=True)]
        with self._lock:
            self._runs[token] = {path.stem: future for path, future in zip(gallery, futures, strict=True)}
            while len(self._runs) > self._keep:
                self._runs.popitem(last=False)
        return Delivery(gallery=gallery, pngs=futures, host_s=host_s)

    def png_for(self, name: str | Path) -> Future | None:
        """The PNG future of the gallery file called `name` (any directory), or None when unknown or forgotten."""
        stem = Path(name).stem
        parts = stem.rsplit("-", 2)
        if len(parts) != 3:
            return None
        with self._lock:
            return self._runs.get(parts[1], {}).get(stem)

    def close(self) -> None:
        """Stop the background pool; PNGs not yet started are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    """Lower the calling pool thread's CPU priority (on Linux a thread is a task with its own nice value)."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not allowed: PNGs come at normal priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PNG_NICENESS)


def _done(value: Path) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
