"""Two engine services (`python -m pipeline serve`) and one page in front (`python app.py --engine ...`) on
loopback, as real processes on the real tiny checkpoint: the token, the endpoints, one request per engine, a closed
connection stopping a request, two requests at once on both engines, an engine SIGKILLed mid-request (the request
still answers, the next ones succeed, the restarted engine rejoins) and no JAX in the page's process."""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import http.client
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from conftest import CONTROLNETS, FIXTURES, REPO, TINY_PT, free_port, run_cli, xla_flags
from PIL import Image

pytestmark = pytest.mark.slow  # three processes: two engines and a page

TOKEN = "test-engine-token"
#: The engines' settings: one small size, few programs (no levers, one prompt window, one ControlNet unit: the tests
#: send one, and the two-unit step was the dearest of the 8 programs each start compiled), 2 devices each, and a
#: ControlNet: `control_engine`'s configuration, so that engine is the embedded reference of a ControlNet request.
#: (Processes of 2 devices compile their own: JAX's cache keys name the process's device count, this one's is 8.)
ENGINE_FLAGS = [
    "--sizes",
    "64x64",
    "--steps",
    "2",
    "--dtype",
    "float32",
    "--cpu-devices",
    "2",
    "--no-speed-levers",
    "--prompt-windows",
    "1",
    "--controlnet",
    str(CONTROLNETS[0]),
    "--controlnet-units",
    "1",
]
#: Steps of a request long enough to act on mid-way (64², 2 devices: a few seconds).
LONG_STEPS = 60
START_S = 600


class Launched:
    """A process whose output goes to a file the test reads while it runs, its TMPDIR a folder beside that file (in
    the test's tmp_path): a process the test kills (SIGKILL) cannot remove its own temporary files."""

    def __init__(self, command: list[str], log: pathlib.Path, env: dict | None = None) -> None:
        # --cpu-devices decides the device count, not the suite's 8 (XLA_FLAGS)
        environment = {**os.environ, "XLA_FLAGS": xla_flags()}
        temp = log.with_name(f"{log.stem}-tmp")
        temp.mkdir(exist_ok=True)
        self.command, self.log = command, log
        self.env = {**environment, "TMPDIR": str(temp), **(env or {})}
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(self.command, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, marker: str, timeout: float = START_S, after: int = 0) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.text()[after:]:
            assert self.process.poll() is None, f"{self.command[1:3]} exited:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {marker!r} within {timeout} s:\n{self.text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


class Engine(Launched):
    def __init__(self, model: pathlib.Path, log: pathlib.Path) -> None:
        self.port = free_port()
        super().__init__(
            [sys.executable, "-m", "pipeline", "serve", "--model", str(model), *ENGINE_FLAGS, "--port", str(self.port)],
            log,
            {"SDXL_ENGINE_TOKEN": TOKEN},
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = TOKEN):
        """(status, headers, body bytes) of one request to this engine."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            connection.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def metric(self, name: str) -> float:
        text = self.call("GET", "/metrics")[2].decode()
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    logs = tmp_path_factory.mktemp("service")
    started = []
    try:
        # Both at once, as a page's engines on one host start: each program is compiled by one of them, the other
        # waits for it and reads it from the compilation cache (pipeline/host/compiling/compile_turns.py).
        started += [Engine(TINY_PT, logs / f"engine{i}.log") for i in range(2)]
        for engine in started:
            engine.wait_for("Serving the engine on")
        yield started
    finally:
        for engine in started:
            engine.stop()


@pytest.fixture(scope="module")
def page(engines, tmp_path_factory):
    port = free_port()
    front = Launched(
        [
            sys.executable,
            "app.py",
            "--port",
            str(port),
            "--no-history",
            *(arg for engine in engines for arg in ("--engine", engine.url)),
        ],
        tmp_path_factory.mktemp("page") / "page.log",
        {"SDXL_ENGINE_TOKEN": TOKEN},
    )
    try:
        front.wait_for("Running on")
        front.url = f"http://127.0.0.1:{port}/"
        front.downloads = tmp_path_factory.mktemp("downloads")  # where the tests' clients put the page's files
        yield front
    finally:
        front.stop()


def client(page):
    from gradio_client import Client

    return Client(page.url, verbose=False, download_files=str(page.downloads))


def generate(page, seed: int, steps: int = 2) -> tuple[list[np.ndarray], int, str]:
    gallery, used, status = client(page).predict(
        "a lighthouse", api_name="/generate", seed=seed, randomize_seed=False, steps=steps
    )
    return [np.asarray(Image.open(item["image"]).convert("RGB")) for item in gallery], used, status


#: An engine's start-up line: served programs, compiled ones, and ones from JAX's cache (executable_store.summary).
STARTUP_PROGRAMS = r"programs \((\d+)\): .*?(\d+) compiled and (\d+) from JAX's compilation cache"


def test_two_engines_started_at_once_compile_each_program_once(engines):
    """Without turns, two engines started together on a cold cache compiled every program twice."""
    counts = []
    for engine in engines:
        found = re.search(STARTUP_PROGRAMS, engine.text())
        assert found, engine.text()[-3000:]
        counts.append(tuple(map(int, found.groups())))  # (served, compiled, from the cache)
    served = counts[0][0]
    assert all(count[0] == served for count in counts) and sum(count[1] for count in counts) <= served, counts


def test_the_token_and_the_endpoints(engines):
    engine = engines[0]
    assert engine.call("GET", "/healthz", token=None)[0] == 200
    for token in (None, "wrong"):
        for path in ("/readyz", "/v1/info", "/metrics"):
            status, _, body = engine.call("GET", path, token=token)
            assert status == 401 and json.loads(body)["error"].endswith(".")
        assert engine.call("POST", "/v1/generate", {"prompt": "a cat"}, token=token)[0] == 401
    assert engine.call("GET", "/readyz")[0] == 200
    info = json.loads(engine.call("GET", "/v1/info")[2])
    assert info["sizes"] == [[64, 64]] and info["num_images"] == 2 and "Euler" in info["samplers"]
    assert info["request_schema"]["title"] == "Request" and str(REPO) not in json.dumps(info)
    metrics = engine.call("GET", "/metrics")[2].decode()
    for name in (
        'sdxl_engine_requests_total{outcome="refused"}',
        "sdxl_engine_request_seconds_bucket",
        "sdxl_engine_busy 0",
        'sdxl_engine_text_cache_total{result="miss"}',
    ):
        assert name in metrics
    status, _, body = engine.call("POST", "/v1/generate", {"prompt": "a cat", "steps": 1000})
    assert status == 400 and json.loads(body) == {"error": "Steps must be a whole number from 1 to 100; got 1000."}


def test_a_second_request_is_refused_at_once_and_a_closed_connection_stops_the_first(engines):
    engine = engines[1]
    stopped_before = engine.metric('sdxl_engine_requests_total{outcome="stopped"}')
    connection = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=120)
    connection.request(
        "POST",
        "/v1/generate",
        json.dumps({"prompt": "a cat", "steps": LONG_STEPS}).encode(),
        {"Authorization": f"Bearer {TOKEN}"},
    )
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.readline())["event"] == "step"
    started = time.monotonic()
    status, headers, body = engine.call("POST", "/v1/generate", {"prompt": "a dog"})
    assert status == 503 and headers["Retry-After"] == "1" and time.monotonic() - started < 5
    assert engine.metric("sdxl_engine_busy") == 1
    response.close()  # the page's Stop: the engine stops at its next step
    connection.close()
    deadline = time.monotonic() + 60
    while engine.metric('sdxl_engine_requests_total{outcome="stopped"}') == stopped_before:
        assert time.monotonic() < deadline, "the closed request did not stop"
        time.sleep(0.1)
    assert engine.metric("sdxl_engine_busy") == 0
    status, _, body = engine.call("POST", "/v1/generate", {"prompt": "a dog", "seed": 3})
    assert status == 200 and json.loads(body.splitlines()[-1])["event"] == "result"


def test_non_loopback_without_a_token_is_refused_before_loading():
    result = run_cli("serve", "--model", "tiny", "--host", "0.0.0.0", env={"SDXL_ENGINE_TOKEN": ""}, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "python -m pipeline serve: error: --host 0.0.0.0 accepts connections from other machines: give a token with "
        "--engine-token or SDXL_ENGINE_TOKEN (the page then sends it with SDXL_ENGINE_TOKEN too)"
    ]


def test_the_page_holds_no_jax_and_runs_two_requests_at_once_on_both_engines(page, engines):
    maps = pathlib.Path(f"/proc/{page.process.pid}/maps")
    if maps.exists():  # Linux: JAX imported means jaxlib's shared library mapped
        assert "jaxlib" not in maps.read_text()
    images, seed, status = generate(page, 11)
    assert seed == 11 and len(images) == 2 and images[0].shape == (64, 64, 3) and "seed 11" in status
    both_busy = False
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        running = [pool.submit(generate, page, seed, LONG_STEPS) for seed in (21, 22)]
        while not all(future.done() for future in running):
            both_busy |= all(engine.metric("sdxl_engine_busy") == 1 for engine in engines)
            time.sleep(0.05)
        answers = [future.result() for future in running]
    assert both_busy, "the two requests never ran on both engines at the same time"
    assert [answer[1] for answer in answers] == [21, 22]


def test_a_killed_engine_the_request_reruns_elsewhere_and_the_restarted_one_rejoins(page, engines):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(generate, page, 31, LONG_STEPS)
        deadline = time.monotonic() + 120
        victim = None
        while victim is None:
            assert time.monotonic() < deadline and not running.done()
            victim = next((engine for engine in engines if engine.metric("sdxl_engine_busy") == 1), None)
            time.sleep(0.05)
        time.sleep(0.5)  # a few steps in
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait(30)
        images, seed, status = running.result(timeout=300)
    assert seed == 31 and len(images) == 2  # re-run once on the other engine, same seed
    again, _, _ = generate(page, 31, LONG_STEPS)
    assert all(np.array_equal(a, b) for a, b in zip(images, again, strict=True))  # same seed, same pixels
    assert generate(page, 32)[1] == 32  # the page keeps serving on the engine left
    page_mark, engine_mark = len(page.text()), len(victim.text())
    victim.start()
    victim.wait_for("Serving the engine on", after=engine_mark)
    page.wait_for(f"engine {victim.url} is ready", timeout=60, after=page_mark)
    before = victim.metric('sdxl_engine_requests_total{outcome="ok"}')
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda seed: generate(page, seed, LONG_STEPS), (41, 42)))
    assert victim.metric('sdxl_engine_requests_total{outcome="ok"}') > before


def test_previews_a_picture_parameters_and_stop_through_the_page(page, engines, tmp_path):
    from gradio_client import handle_file

    picture = tmp_path / "start.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(picture)
    job = client(page).submit(
        "a lighthouse",
        api_name="/generate",
        seed=51,
        randomize_seed=False,
        steps=8,
        init_image=handle_file(str(picture)),
        strength=0.5,
        previews=True,
    )
    gallery, seed, status = job.result(timeout=300)
    assert seed == 51 and "from a picture, strength 0.5" in status
    forming = [out[0][0]["caption"] for out in job.outputs()[:-1] if isinstance(out[0], list) and out[0]]
    assert any(caption.startswith("step ") for caption in forming), job.outputs()  # the pictures forming
    gallery, _, _ = client(page).predict("a lighthouse", api_name="/generate_png", seed=52, randomize_seed=False)
    assert "Seed: 52" in Image.open(gallery[0]["image"]).info["parameters"]
    stopped_before = sum(e.metric('sdxl_engine_requests_total{outcome="stopped"}') for e in engines)
    job = client(page).submit("a lighthouse", api_name="/generate", seed=53, randomize_seed=False, steps=100)
    deadline = time.monotonic() + 120
    while not any(e.metric("sdxl_engine_busy") == 1 for e in engines):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with contextlib.suppress(httpx.TimeoutException):  # a loaded machine may answer /cancel late: its effect counts
        job.cancel()  # as Stop or a closed tab: the page closes the engine's connection, the engine stops
    while sum(e.metric('sdxl_engine_requests_total{outcome="stopped"}') for e in engines) == stopped_before:
        assert time.monotonic() < deadline, "the engine did not stop the cancelled request"
        time.sleep(0.1)


def test_a_controlnet_request_through_the_page_gives_the_embedded_engines_pixels(page, control_engine):
    """The page checks the unit (canny of the picture) and sends the finished map to an engine, which runs it as
    the embedded engine of the same configuration does: same pixels, A1111's ControlNet entry in `parameters`."""
    picture = FIXTURES / "image-input.png"
    unit = {
        "name": "controlnet-a",
        "image": base64.b64encode(picture.read_bytes()).decode(),
        "weight": 0.9,
        "start": 0.25,
        "preprocessor": "canny",
        "low": 60,
        "high": 140,
    }
    gallery, seed, _ = client(page).predict(
        "a lighthouse", api_name="/generate_png", seed=61, randomize_seed=False, steps=4, controlnets=[unit]
    )
    text = Image.open(gallery[0]["image"]).info["parameters"]
    assert 'ControlNet 0: "Module: canny, Model: controlnet-a, Weight: 0.9, Guidance Start: 0.25' in text, text
    before = control_engine.compile_count
    request = control_engine.request("a lighthouse", seed=61, steps=4, controlnets=[{**unit, "image": picture}])
    expected = [np.asarray(image, np.int16) for image in control_engine.generate(request).images]
    got = [np.asarray(Image.open(item["image"]).convert("RGB"), np.int16) for item in gallery]
    assert seed == 61 and len(got) == len(expected) == 2 and control_engine.compile_count == before
    for mine, reference in zip(got, expected, strict=True):  # 2 devices of 8 here, of 2 there: XLA's own rounding
        assert np.abs(mine - reference).max() <= 1, np.abs(mine - reference).max()


def test_a_page_whose_only_engine_is_killed_says_why_at_once_then_says_it_waits(engines, tmp_path):
    """A page of its own in front of one of the module's engines, `kill -9` while the pictures form: the client gets
    the sentence that says what happened (no host), sooner than the 10 s the re-run used to wait for another engine;
    the gallery's last message is the last finished images, not the dead preview. With the engine down, the next
    request's progress text says it waits ("0 of 1 ready"); the engine restarts and the request runs (or, past the
    wait, says none is ready). The page's log: no JAX devices, no Starlette warning, no traceback at its INFO level.
    The module's last test: the engine it kills and restarts is left to `engines` (an engine start of its own cost
    a JAX start-up and a load)."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    from web.engines.remote import NO_ENGINE_WAIT_S

    engine = engines[0]
    front = None
    try:
        port = free_port()
        front = Launched(
            [sys.executable, "app.py", "--port", str(port), "--no-history", "--engine", engine.url],
            tmp_path / "page.log",
            {"SDXL_ENGINE_TOKEN": TOKEN},
        )
        front.wait_for("Running on")
        # no downloads: its view of the stream does not lag behind file transfers
        caller = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        finished, _, _ = caller.predict("a lighthouse", api_name="/generate", seed=71, randomize_seed=False, steps=2)
        job = caller.submit(
            "a lighthouse", api_name="/generate", seed=72, randomize_seed=False, steps=100, previews=True
        )  # the API's default is none: this test kills the engine while they show

        def forming() -> bool:
            return any(
                isinstance(out[0], list) and out[0] and out[0][0]["caption"].startswith("step ")
                for out in job.outputs()
            )

        deadline = time.monotonic() + 120
        while not forming():
            assert not job.done() and time.monotonic() < deadline, "no preview before the request ended"
            time.sleep(0.02)
        engine.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(AppError) as caught:
            job.result(timeout=120)
        answered = time.monotonic() - killed
        sentence = str(caught.value)
        assert sentence.startswith("The engine stopped mid-request (connection lost at step "), sentence
        assert sentence.endswith("/ 100) and no other engine is ready to run it again; please try again."), sentence
        assert "127.0.0.1" not in sentence and str(engine.port) not in sentence
        assert answered < 10, f"{answered:.1f} s from the kill to the sentence"  # the old re-run's wait alone was 10 s
        last_gallery = job.outputs()[-1][0]
        assert [item["caption"] for item in last_gallery] == [item["caption"] for item in finished]  # not a preview
        engine.process.wait(30)

        engine_mark = len(engine.text())
        engine.start()  # loading: the page knows one engine, none ready
        job = caller.submit("a lighthouse", api_name="/generate", seed=73, randomize_seed=False, steps=2)
        submitted = time.monotonic()
        deadline = submitted + NO_ENGINE_WAIT_S
        while "waiting for an engine (0 of 1 ready)" not in [unit.desc for unit in job.status().progress_data or []]:
            assert not job.done() and time.monotonic() < deadline, job.status()
            time.sleep(0.05)
        try:
            _, seed, _ = job.result(timeout=START_S)
            assert seed == 73 and "Serving the engine on" in engine.text()[engine_mark:]  # it ran once one came
        except AppError as exc:  # the restart took longer than the page waits for an engine
            assert str(exc) == "No engine is available to run this request right now; please try again shortly."
            assert time.monotonic() - submitted >= NO_ENGINE_WAIT_S  # not before it waited
        log = front.text()
        assert "JAX devices" not in log and "HTTP_422" not in log and "Traceback" not in log, log[-3000:]
        assert "engine stopped mid-request" in log  # said once to the operator too, with the step
    finally:
        if front is not None:
            front.stop()
