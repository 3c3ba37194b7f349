"""The app's files on disk: one temporary folder per process (Gradio's cache and each page's runs), removed at exit.

Every generated image lives here and nowhere else: the gallery's files, their PNGs, and Gradio's copies of what it
served. Nothing in it outlives the process (the last page's close, and atexit, remove it).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import os
import pathlib
import shutil
import tempfile
import threading
import time

#: Content files (see `RunFiles.content_file`) live this long; a sweep runs every CONTENT_SWEEP_EVERY writes.
CONTENT_MAX_AGE_S = 900
CONTENT_SWEEP_EVERY = 200
#: Runs whose files we keep on disk until Gradio has copied them into its cache: two runs are in flight and each
#: run's PNGs are fetched by a follow-up event just after its answer, so 16 leaves a wide margin.
KEEP_RUNS = 16


class ProcessFolder:
    """This process's temporary folder while a page is open: Gradio's cache of served files (`gradio/`), cached
    examples (`examples/`) and one folder per open page; removed when the last page closes.

    Gradio reads GRADIO_TEMP_DIR whenever it makes a component, not only while the page is built: an answer that
    updates an output (`gr.skip()` after a Stop, `gr.update(...)`) rebuilds that component in the session's state at
    request time, and the copy caches its files wherever the variable then points. The file route serves only the
    folder the variable named at launch, so both variables point here for as long as any page is open; pointing them
    here only while the page was built sent every later image of a stopped tab to $TMPDIR/gradio (403, left behind).

    It is made inside GRADIO_TEMP_DIR when the operator sets it, else the system's temporary directory.
    """

    _lock = threading.Lock()
    _pages = 0
    root: pathlib.Path | None = None
    _saved: dict[str, str | None] = {}

    @classmethod
    def open_page(cls) -> pathlib.Path:
        """A new page's own folder inside the process folder (made, and the variables set, for the first page)."""
        with cls._lock:
            if cls._pages == 0:
                base = os.environ.get("GRADIO_TEMP_DIR") or None
                if base:
                    pathlib.Path(base).mkdir(parents=True, exist_ok=True)
                cls.root = pathlib.Path(tempfile.mkdtemp(prefix="sdxl-jax-app-", dir=base))
                atexit.register(shutil.rmtree, cls.root, True)  # also when the process ends another way
                values = {"GRADIO_TEMP_DIR": cls.root / "gradio", "GRADIO_EXAMPLES_CACHE": cls.root / "examples"}
                cls._saved = {name: os.environ.get(name) for name in values}
                os.environ.update({name: str(value) for name, value in values.items()})
            cls._pages += 1
            return pathlib.Path(tempfile.mkdtemp(prefix="page-", dir=cls.root))

    @classmethod
    def close_page(cls, folder: pathlib.Path) -> None:
        """Remove a page's folder; with the last page, the whole process folder, and restore the variables."""
        with cls._lock:
            shutil.rmtree(folder, ignore_errors=True)
            cls._pages = max(cls._pages - 1, 0)
            if cls._pages or cls.root is None:
                return
            shutil.rmtree(cls.root, ignore_errors=True)
            cls.root = None
            _remove_gradio_leftover()
            for name, value in cls._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    @classmethod
    def remove_all(cls) -> None:
        """Remove the process folder whatever is open (start-up stopped; the process is leaving)."""
        with cls._lock:
            if cls.root is not None:
                shutil.rmtree(cls.root, ignore_errors=True)


def _remove_gradio_leftover() -> None:
    """Gradio makes an empty `vibe_edit_history` folder in the temporary directory it read at import (before
    ProcessFolder points it here) for every app it builds; removed with its `gradio` parent, each only if empty."""
    from ..gradio_internals import import_time_temp_dir  # heavy: 30 ms (dataclasses) on app.py's first import

    folder = pathlib.Path(import_time_temp_dir()) / "vibe_edit_history"
    for empty in (folder, folder.parent):
        with contextlib.suppress(OSError):  # not empty (someone else's), or already gone
            empty.rmdir()


class RunFiles:
    """One page's temporary files: per-run directories for the files handed to the gallery (and their PNGs; only the
    last KEEP_RUNS survive), inside the process folder beside Gradio's cache (see `ProcessFolder`); removed by
    `cleanup()`, Gradio's copies with the last page."""

    def __init__(self, keep: int = KEEP_RUNS) -> None:
        self.root = ProcessFolder.open_page()
        self.gradio_cache = pathlib.Path(os.environ["GRADIO_TEMP_DIR"])
        self._runs: collections.deque[pathlib.Path] = collections.deque()
        self._keep = keep
        self._count = 0
        self._lock = threading.Lock()
        self._closed = False
        self._content_writes = 0

    def new_dir(self) -> pathlib.Path:
        with self._lock:
            self._count += 1
            path = self.root / f"run-{self._count:06d}"
            path.mkdir()
            self._runs.append(path)
            while len(self._runs) > self._keep:
                shutil.rmtree(self._runs.popleft(), ignore_errors=True)
            return path

    def content_file(self, data: bytes, suffix: str) -> pathlib.Path:
        """`data` as a file named by its content (written once; the same bytes give the same file), for images
        handed to Gradio as they are made (previews, browser-history thumbnails).

        Gradio's own way for in-memory images rewrites the file whenever the same bytes come again, which can cut
        off a browser still reading it (two previews alike, a tab shown twice); a file path is copied into Gradio's
        cache once. Files older than CONTENT_MAX_AGE_S are removed now and then (Gradio has copied them by then).
        """
        folder = self.root / "content"
        path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}{suffix}"
        if path.exists():
            return path
        folder.mkdir(exist_ok=True)
        partial = folder / f".{path.name}.{threading.get_ident()}"
        partial.write_bytes(data)
        os.replace(partial, path)  # whole or absent: never half a file
        with self._lock:
            self._content_writes += 1
            sweep = self._content_writes % CONTENT_SWEEP_EVERY == 0
        if sweep:
            _remove_older(folder, CONTENT_MAX_AGE_S)
        return path

    def cleanup(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        ProcessFolder.close_page(self.root)


def _remove_older(folder: pathlib.Path, age_s: float) -> None:
    """Remove the files in `folder` last changed more than `age_s` seconds ago."""
    limit = time.time() - age_s
    for entry in os.scandir(folder):
        with contextlib.suppress(OSError):
            if entry.stat().st_mtime < limit:
                os.unlink(entry.path)
