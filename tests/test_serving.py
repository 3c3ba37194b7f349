"""Safe serving: clean shutdown on signals, no secrets in logs, no files served beyond Gradio's own and assets/."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import TEST_SIZE, TEST_STEPS, free_port

import app

REPO = Path(__file__).resolve().parent.parent
SECRET = "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0123"


@pytest.fixture(scope="module")
def server(engine):
    demo = app.build_demo(engine)
    app.launch(demo, port=free_port(), prevent_thread_lock=True, quiet=True)
    yield demo.local_url.rstrip("/")
    app.close_demo(demo)


@pytest.mark.parametrize(
    "path",
    [
        "/gradio_api/file=README.md",
        f"/gradio_api/file={REPO / 'app.py'}",
        "/gradio_api/file=/etc/passwd",
        "/gradio_api/file=../../../../etc/passwd",
        "/gradio_api/file=%2Fetc%2Fpasswd",
        "/file=/etc/passwd",
        "/README.md",
        "/app.py",
    ],
)
def test_files_outside_are_refused(server, path):
    response = httpx.get(server + path)
    assert response.status_code in (403, 404), (path, response.status_code)
    assert "root:" not in response.text and "import gradio" not in response.text


def test_page_and_api_are_served(server):
    assert httpx.get(server + "/").status_code == 200
    assert httpx.get(server + "/gradio_api/info").status_code == 200


def test_binds_loopback_and_no_share_link_by_default():
    args = app.parse_args([])
    assert args.host == "127.0.0.1" and args.share is False


def _read_until(process: subprocess.Popen, marker: str, timeout: float) -> list[str]:
    """Collect the process's output lines (still growing) until `marker` appears, it exits, or time runs out."""
    lines: list[str] = []
    found = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    found.wait(timeout)
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_app_process_starts_warm_and_stops_cleanly_on_signal(tiny_dir, sig):
    port = free_port()
    env = {**os.environ, "HF_TOKEN": SECRET, "HUGGING_FACE_HUB_TOKEN": SECRET, "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable, "app.py", "--model", str(tiny_dir), "--height", str(TEST_SIZE), "--width", str(TEST_SIZE),
        "--steps", str(TEST_STEPS), "--dtype", "float32", "--port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = _read_until(process, "Running on", timeout=300)
        output = "".join(lines)
        assert "Running on http://127.0.0.1:" in output, output
        # Warm before open: every phase was logged before the URL was printed.
        url_at = output.index("Running on")
        for phase in ("load", "compile", "first run", "engine ready"):
            assert phase in output[:url_at], phase
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200
        started = time.monotonic()
        process.send_signal(sig)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        if process.poll() is None:
            process.kill()
    time.sleep(0.2)
    output = "".join(lines)
    assert "stopped" in output and "Traceback" not in output
    assert SECRET not in output


@pytest.mark.slow
@pytest.mark.browser
def test_no_generated_file_is_left_under_tmpdir_after_a_stopped_tab_and_sigterm(tiny_dir, tmp_path):
    """The sequence that once sent a tab's images to $TMPDIR/gradio (403, never removed), then SIGTERM: the tab's
    images load, and no image file of this run is left anywhere under TMPDIR (issue 26)."""
    from conftest import headless_chromium, stop_then_generate

    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONUNBUFFERED": "1",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}  # fmt: skip
    env.pop("GRADIO_TEMP_DIR", None)
    command = [
        sys.executable, "app.py", "--model", str(tiny_dir), "--height", str(TEST_SIZE), "--width", str(TEST_SIZE),
        "--steps", str(TEST_STEPS), "--dtype", "float32", "--port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = _read_until(process, "Running on", timeout=300)
        assert "Running on" in "".join(lines), "".join(lines)
        with headless_chromium() as browser:
            page = browser.new_page()
            loads = stop_then_generate(page, f"http://127.0.0.1:{port}/", "4 steps")
        assert len(loads) == 2 and all(status == 200 and decoded for status, decoded in loads), loads
        assert list(temp.rglob("*.jpg")), "the run's images should be under TMPDIR while the app serves"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    left = [p for p in temp.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".webp")]
    assert not left, left
