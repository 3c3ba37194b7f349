"""gradio_client (2.7.2) downloads each file of an answer into a new folder `$TMPDIR/<40 hex digits>`, moves the file
into the client's download folder and leaves that folder behind, empty: one per file fetched (a bench serving run
left hundreds in /tmp, a run of the test suite 768). `tidy_downloads()` makes each download remove its own staging
folder when it is done; the bench's clients and the test suite's call it."""

from __future__ import annotations

import secrets
import shutil
import tempfile
import threading
from pathlib import Path


def tidy_downloads() -> None:
    """Patch gradio_client (once per process) so that each download removes its staging folder, also when the
    download failed midway (the folder then holds the partial file). The token gradio_client names the folder by
    (`secrets.token_hex(20)`) is recorded per thread: a client downloads an answer's files in several threads."""
    import gradio_client.client as client_module

    endpoint = client_module.Endpoint
    if getattr(endpoint._download_file, "tidy", False):
        return
    last = threading.local()

    class RecordedTokens:
        """`secrets` as gradio_client.client uses it, its `token_hex` remembered for this thread."""

        def __getattr__(self, name):
            return getattr(secrets, name)

        @staticmethod
        def token_hex(nbytes=None):
            last.token = secrets.token_hex(nbytes)
            return last.token

    client_module.secrets = RecordedTokens()
    original = endpoint._download_file

    def tidy_download(self, x):
        last.token = None
        try:
            return original(self, x)
        finally:
            if last.token is not None:
                shutil.rmtree(Path(tempfile.gettempdir()) / last.token, ignore_errors=True)

    tidy_download.tidy = True
    endpoint._download_file = tidy_download
