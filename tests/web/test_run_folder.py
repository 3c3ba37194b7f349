"""Generated images stay in the app's own temporary folder (web/serving/temp_files.py) while a page serves, and go with
it: the last page's close removes it and restores Gradio's temporary-folder variables. No other page may be open in this
process meanwhile, so this file launches its own page and nothing else."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from conftest import served
from gradio_client import Client

from web.page.layout import DELETE_CACHE


def test_served_images_live_in_the_apps_folder_and_go_at_exit(engine, tmp_path):
    seed = 918273645  # a name no other test's files carry
    shared = Path(tempfile.gettempdir()) / "gradio"
    before = os.environ.get("GRADIO_TEMP_DIR")
    with served(engine, examples=[]) as page:
        files = page.files
        # Gradio reads it at request time too (a session's copy of an updated output): it points here while serving.
        assert os.environ.get("GRADIO_TEMP_DIR") == str(files.gradio_cache) != before
        assert page.demo.delete_cache == DELETE_CACHE  # bounded while running: old files are swept
        client = Client(page.local_url, verbose=False, download_files=str(tmp_path / "client"))
        gallery, _, _ = client.predict(prompt="a red kite", seed=seed, randomize_seed=False, api_name="/generate")
        assert len(gallery) == engine.num_images
        copies = sorted(files.gradio_cache.rglob(f"sdxl-{seed}-*.jpg"))
        assert len(copies) == engine.num_images  # Gradio's copies, inside the app's folder
        assert not list(shared.rglob(f"sdxl-{seed}-*")) if shared.is_dir() else True
    assert not files.root.exists() and not files.gradio_cache.exists()
    assert os.environ.get("GRADIO_TEMP_DIR") == before  # restored with the last page
