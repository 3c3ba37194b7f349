"""Part `service`: the engine as a service with the page in front (`python -m pipeline serve`,
`python app.py --engine URL`): what the page→engine hop adds per request, requests/s with one and two engines, and
how long a killed engine takes to be noticed and a restarted one to serve again.

    python -m bench --only service --runs 9

The engines are real `python -m pipeline serve` processes with the bench's engine settings (their programs loaded
whole from the executables the bench's own engine stored); the page's side is `web.engines.remote.RemoteEngines`,
the very object the page's handlers call (the rest of the page is the same code embedded or in front, so the hop is
`RemoteEngines.generate` against the embedded `Generator.generate` on the same request, interleaved: one runs while
the other idles). Bytes are the request body and the streamed answer as sent. The host path at 1024²: 8 synthetic
photo-like images through the wire format (PNG level 1 + base64 + JSON, then decoded), no engine.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..common import Stats, free_port, progress

PROMPT = "a lighthouse on a cliff at dawn, dramatic sky"
REPO = Path(__file__).resolve().parents[2]
#: Requests sent by the throughput clients (per engine count) and how many at once.
THROUGHPUT_REQUESTS = 16
THROUGHPUT_CLIENTS = 4


@dataclass(frozen=True)
class ServiceCost:
    images: int
    size: tuple[int, int]
    steps: int
    embedded: Stats  # Generator.generate in this process, s
    remote: Stats  # RemoteEngines.generate against one engine process, s
    remote_engine: Stats  # the engine's own total_s of those calls, s
    hop_ms: float  # median(remote) - median(embedded)
    hop_host_ms: float  # median(remote wall - its engine's total_s) - median(embedded wall - its total_s): the hop
    # alone, without the device time's spread under load
    request_bytes: int
    answer_bytes: int
    wire_1024: dict  # 8 images at 1024²: encode_ms, decode_ms, bytes
    rps: dict  # engines -> requests/s
    noticed_s: Stats  # SIGKILL -> the page counts the engine out
    engine_start_s: float  # restart -> the engine's /readyz answers 200
    rejoin_after_ready_s: float  # /readyz 200 -> the page sends it requests again
    load_average: tuple[float, ...]


class EngineProcess:
    """One `python -m pipeline serve` on a free port."""

    def __init__(self, flags: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "pipeline", "serve", *flags, "--port", str(self.port)]
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self) -> float:
        """Start it; the moment it started (perf_counter)."""
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(
                self.command,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
            )
        return time.perf_counter()

    def ready(self) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def wait_ready(self, timeout: float = 1800) -> float:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engine {self.url} did not start; see {self.log}")
            time.sleep(0.02)
        return time.perf_counter()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def engine_flags(args) -> list[str]:
    return [
        "--model",
        args.model,
        "--sizes",
        f"{args.width}x{args.height}",
        "--steps",
        str(args.steps),
        "--dtype",
        args.dtype,
        "--cpu-devices",
        str(args.cpu_devices),
    ]


def service_cost(generator, args, runs: int, out: Path) -> ServiceCost:
    """Every figure of the part (engines started and stopped here)."""
    from web.engines.remote import RemoteEngines

    out.mkdir(parents=True, exist_ok=True)
    engines = [EngineProcess(engine_flags(args), out / f"engine{i}.log") for i in range(2)]
    try:
        for engine in engines:
            engine.start()
        for engine in engines:
            engine.wait_ready()
        progress(f"service: engines ready at {', '.join(e.url for e in engines)}")
        one = RemoteEngines.connect([engines[0].url], wait_s=60)
        request = generator.request(PROMPT, seed=1)
        embedded, embedded_engine, remote, remote_engine = [], [], [], []
        for _ in range(runs):
            started = time.perf_counter()
            local = generator.generate(request)
            embedded.append(time.perf_counter() - started)
            embedded_engine.append(float(local.timings.get("total_s", 0.0)))
            started = time.perf_counter()
            result = one.generate(request)
            remote.append(time.perf_counter() - started)
            remote_engine.append(float(result.timings.get("total_s", 0.0)))
        request_bytes, answer_bytes = _bytes(engines[0], request)
        progress(
            f"service: hop {(Stats.of(remote).median - Stats.of(embedded).median) * 1000:.0f} ms, "
            f"{request_bytes} B up, {answer_bytes} B down"
        )
        two = RemoteEngines.connect([e.url for e in engines], wait_s=60)
        rps = {1: _throughput(one, generator), 2: _throughput(two, generator)}
        progress(f"service: {rps[1]:.2f} requests/s with one engine, {rps[2]:.2f} with two")
        noticed, start_s, rejoin_s = _failover(two, engines[1], runs=max(1, min(runs, 3)))
        one.close()
        two.close()
    finally:
        for engine in engines:
            engine.stop()
    return ServiceCost(
        images=generator.num_images,
        size=request.size,
        steps=request.steps,
        embedded=Stats.of(embedded),
        remote=Stats.of(remote),
        remote_engine=Stats.of(remote_engine),
        hop_ms=(Stats.of(remote).median - Stats.of(embedded).median) * 1000,
        hop_host_ms=(
            Stats.of([w - e for w, e in zip(remote, remote_engine, strict=True)]).median
            - Stats.of([w - e for w, e in zip(embedded, embedded_engine, strict=True)]).median
        )
        * 1000,
        request_bytes=request_bytes,
        answer_bytes=answer_bytes,
        wire_1024=_wire_at_1024(),
        rps=rps,
        noticed_s=Stats.of(noticed),
        engine_start_s=start_s,
        rejoin_after_ready_s=rejoin_s,
        load_average=os.getloadavg(),
    )


def _bytes(engine: EngineProcess, request) -> tuple[int, int]:
    """(request body, streamed answer) bytes of one request without previews, as the page sends and reads them."""
    body = json.dumps(request.to_dict()).encode()
    connection = http.client.HTTPConnection("127.0.0.1", engine.port, timeout=600)
    try:
        connection.request("POST", "/v1/generate?previews=0", body, {"Content-Type": "application/json"})
        return len(body), len(connection.getresponse().read())
    finally:
        connection.close()


def _throughput(engines, generator) -> float:
    """Requests/s of THROUGHPUT_REQUESTS requests from THROUGHPUT_CLIENTS threads through `engines`."""
    requests = [generator.request(PROMPT, seed=100 + i) for i in range(THROUGHPUT_REQUESTS)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(THROUGHPUT_CLIENTS) as pool:
        list(pool.map(engines.generate, requests))
    return THROUGHPUT_REQUESTS / (time.perf_counter() - started)


def _failover(engines, victim: EngineProcess, runs: int) -> tuple[list[float], float, float]:
    """SIGKILL `victim` (idle) `runs` times: seconds until the page counts it out; then restart it once more and time
    its start-up and the page's rejoin after its /readyz answers."""
    noticed = []
    start_s = rejoin_s = float("nan")
    for _ in range(runs):
        endpoint = next(e for e in engines.pool.ready if e.port == victim.port)
        killed = time.perf_counter()
        victim.process.send_signal(signal.SIGKILL)
        victim.process.wait()
        while endpoint in engines.pool.ready:
            time.sleep(0.01)
        noticed.append(time.perf_counter() - killed)
        started = victim.start()
        ready = victim.wait_ready()
        while endpoint not in engines.pool.ready:
            time.sleep(0.01)
        start_s, rejoin_s = ready - started, time.perf_counter() - ready
    return noticed, start_s, rejoin_s


def _wire_at_1024() -> dict:
    """8 photo-like 1024² images through the wire format and back: ms each way and bytes."""
    from PIL import Image

    from ..engine import GenerationResult, RemoteResult, result_line
    from .fullsize import synthetic_pixels

    pixels = synthetic_pixels(8, 1024, "photo")
    words = ["a lighthouse\nSteps: 25, Sampler: Euler, CFG scale: 5, Seed: 1, Size: 1024x1024"] * 8
    result = GenerationResult(
        images=[Image.fromarray(p) for p in pixels],
        seeds=list(range(8)),
        prompt="a lighthouse",
        negative_prompt="",
        truncated="",
        parameters=words,
        steps=25,
        sampler="Euler",
    )
    started = time.perf_counter()
    line = result_line(result)
    encoded = time.perf_counter() - started
    started = time.perf_counter()
    RemoteResult.of(json.loads(line))
    decoded = time.perf_counter() - started
    return {"encode_ms": encoded * 1000, "decode_ms": decoded * 1000, "bytes": len(line)}


def markdown(cost: ServiceCost | None) -> list[str]:
    """The results.md section."""
    if cost is None:
        return []
    h, w = cost.size
    return [
        f"## The engine as a service, the page in front ({cost.images} images, {w}×{h}, {cost.steps} steps)",
        "",
        "| what | measured |",
        "|---|---|",
        f"| embedded `Generator.generate` | {cost.embedded.range_text(1000, 0)} ms |",
        f"| `RemoteEngines.generate` → one engine process | {cost.remote.range_text(1000, 0)} ms (the engine's own "
        f"{cost.remote_engine.median * 1000:.0f} ms) |",
        f"| **the hop** (wall time beside the engine's own, remote − embedded) | **{cost.hop_host_ms:+.0f} ms** "
        f"(difference of the medians: {cost.hop_ms:+.0f} ms), {cost.request_bytes} B up, "
        f"{cost.answer_bytes / 1024:.0f} KiB down |",
        f"| wire format, 8 images at 1024² (host path) | encode {cost.wire_1024['encode_ms']:.0f} ms, decode "
        f"{cost.wire_1024['decode_ms']:.0f} ms, {cost.wire_1024['bytes'] / 2**20:.1f} MiB |",
        f"| requests/s, one engine / two ({THROUGHPUT_CLIENTS} clients) | {cost.rps[1]:.2f} / {cost.rps[2]:.2f} |",
        f"| SIGKILL → the page counts the engine out | {cost.noticed_s.range_text(1, 2)} s |",
        f"| restart → serving again | {cost.engine_start_s:.1f} s engine start-up + "
        f"{cost.rejoin_after_ready_s:.2f} s until the page uses it |",
        "",
        "Load average at the end: " + ", ".join(f"{x:.1f}" for x in cost.load_average) + ".",
        "",
    ]
