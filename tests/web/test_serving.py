"""web/serving/server.launch's own reachability check (Gradio's gives each try 3 s and failed a page on a loaded CI
machine): a page that answers is served, a URL that never answers is one sentence, not a hang."""

from __future__ import annotations

import time

import gradio as gr
import httpx
import pytest
from conftest import free_port

from web.serving.server import PageUnreachable, launch, wait_until_reachable


def test_a_page_without_an_engine_launches_and_answers():
    with gr.Blocks() as blocks:
        gr.Markdown("hello")
    launch(blocks, host="127.0.0.1", port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        assert httpx.get(blocks.local_url, timeout=30).status_code == 200
    finally:
        blocks.close()


def test_a_url_that_never_answers_is_one_sentence_within_the_wait():
    url = f"http://127.0.0.1:{free_port()}/"
    started = time.monotonic()
    with pytest.raises(PageUnreachable, match=r"did not answer within 2 s: localhost is not reachable here"):
        wait_until_reachable(url, within_s=2)
    assert 2 <= time.monotonic() - started < 20
