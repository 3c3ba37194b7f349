"""The page's examples: one button per example prompt, its answer kept for the page's life.

The first click on an example generates it (with its fixed seed, live previews and the Stop button, like Generate);
later clicks, from any visitor, show the kept images at once. Gradio's own `gr.Examples` did the same with a lazy
cache, but it renders a `gr.Dataset`, and Gradio 6.17.3's image editor goes into an endless Svelte effect loop
('effect_update_depth_exceeded': the tab freezes) whenever the server sets its picture on a page that holds a
Dataset, which the picture input (an uploaded picture shown in the mask editor) and Vary both do. Plain buttons
leave the editor alone.
"""

from __future__ import annotations

import pathlib
import shutil
import threading
from collections.abc import Hashable


class ExampleCache:
    """Each example's finished answer (gallery, seed, status), its images copied into a folder of their own so that
    the page's run folders (pruned after KEEP_RUNS runs) never take them away."""

    def __init__(self, folder: pathlib.Path) -> None:
        self.folder = folder  # inside the page's folder (web/serving/temp_files.py): removed with the page
        self._answers: dict[Hashable, tuple] = {}  # key -> (gallery [(path, caption)], seed, status)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> tuple | None:
        with self._lock:
            return self._answers.get(key)

    def keep(self, key: Hashable, answer: tuple) -> tuple:
        """Keep a finished answer (its images copied here) and return it with the kept paths; the first kept wins."""
        gallery, seed, status = answer
        with self._lock:
            if key in self._answers:
                return self._answers[key]
            folder = self.folder / f"example-{len(self._answers):03d}"
            folder.mkdir(parents=True, exist_ok=True)
            kept = []
            for path, caption in gallery:
                copy = folder / pathlib.Path(path).name
                shutil.copyfile(path, copy)
                kept.append((str(copy), caption))
            self._answers[key] = (kept, seed, status)
            return self._answers[key]
