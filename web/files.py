"""The app's files on disk: one temporary folder per process (Gradio's cache and each page's runs), removed at exit.

Every generated image lives here and nowhere else: the gallery's files, their PNGs, and Gradio's copies of what it
served. Nothing in it outlives the process (the last page's close, and atexit, remove it).
"""

from __future__ import annotations

import atexit
import collections
import os
import pathlib
import shutil
import tempfile
import threading

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

    def new_dir(self) -> pathlib.Path:
        with self._lock:
            self._count += 1
            path = self.root / f"run-{self._count:06d}"
            path.mkdir()
            self._runs.append(path)
            while len(self._runs) > self._keep:
                shutil.rmtree(self._runs.popleft(), ignore_errors=True)
            return path

    def cleanup(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        ProcessFolder.close_page(self.root)
