"""Part 3: the engine served through the Gradio app, called with gradio_client as an API user would.

First the serving overhead of one `/generate` call over the engine-only `generate` for the same arguments, then
throughput and latency percentiles with N concurrent clients (threads, each with its own Client), counting
failures and queue-full rejections apart. `drive_load` is shared with the soak part.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from ..common import Progress, Stats, free_port, progress, random_request, timed

PROMPT = "a lighthouse on a cliff at dawn, dramatic sky"
NEGATIVE = "blurry, low quality"
TARGET_OVERHEAD = 0.10
#: What gradio_client raises (QueueError) when the server's queue is full: the busy message users see.
BUSY_MESSAGE = "Queue is full"


@dataclass(frozen=True)
class LoadResult:
    """N concurrent API clients, each sending a fixed number of requests back to back."""

    clients: int  # concurrent clients (threads, one gradio_client.Client each)
    requests: int  # requests sent in all
    succeeded: int  # requests answered with images
    failed: int  # requests that failed for any reason but a full queue (including timeouts)
    rejected: int  # requests turned away because the queue was full
    failure_messages: list[str]  # distinct failure messages (first 200 characters)
    rejection_messages: list[str]  # distinct queue-full messages
    wall_s: float  # first request sent -> last answer
    requests_per_s: float  # succeeded / wall_s
    images_per_s: float  # succeeded * images per request / wall_s
    latency: Stats  # seconds per successful request, as the client saw it (queueing included)


@dataclass(frozen=True)
class ServingResult:
    """The app's cost on top of the engine, and its behaviour under concurrency."""

    engine: Stats  # seconds per Generator.generate call (same arguments as the API call)
    app: Stats  # seconds per gradio_client /generate call (HTTP, queue, gallery JPEGs, download)
    app_no_download: Stats  # the same call from a client that does not download the images (download_files=False)
    png_save: Stats  # seconds to write one call's PNGs (GenerationResult.save_pngs), timed apart: since issue 19
    # the app writes them in the background, off the answer's path
    gradio_floor: Stats  # a do-nothing echo endpoint with the same queue, through gradio_client: Gradio's own cost
    overhead: float  # (app median - engine median) / engine median
    target_overhead: float  # the goal: overhead <= this
    meets_target: bool  # overhead <= target_overhead
    queue_size: int  # the app's queue size (more waiting requests are rejected)
    load: list[LoadResult]  # one per concurrency level
    compiles_added: int  # XLA compilations during this whole part (must be 0)


def launch_app(generator, queue_size: int):
    """Build the app around a warm generator and serve it in this process on a free port."""
    from web.page.layout import build_page

    return build_page(generator, queue_size=queue_size).launch(port=free_port(), prevent_thread_lock=True, quiet=True)


def close_app(page) -> None:
    """Stop the server and remove its temporary files."""
    page.close()


def make_client(url: str, download_dir: str | bool):
    """One API client, as a user's script would make it (`download_dir` False: it fetches no file); its downloads
    leave no empty folder in TMPDIR (gradio_downloads)."""
    from gradio_client import Client

    from .gradio_downloads import tidy_downloads

    tidy_downloads()
    return Client(url, verbose=False, download_files=download_dir)


def serving_overhead(generator, client, bare_client, runs: int) -> dict[str, Stats]:
    """Interleave engine-only and through-the-app calls with the same arguments; seconds of each kind.

    `bare_client` does not download the images, and the PNG writing is timed on its own, to split the overhead.
    """
    kwargs = {"negative_prompt": NEGATIVE, "guidance_scale": 5.0}
    api = {"style": "No style", "randomize_seed": False, "api_name": "/generate"}
    for warm in (client, bare_client):
        warm.predict(prompt=PROMPT, **kwargs, seed=0, **api)
    times: dict[str, list[float]] = {"engine": [], "app": [], "app_no_download": [], "png_save": []}
    with tempfile.TemporaryDirectory(prefix="sdxl-bench-png-") as png_dir:
        for run in range(runs):
            seed = 2000 + run
            times["app"].append(timed(lambda s=seed: client.predict(prompt=PROMPT, **kwargs, seed=s, **api))[0])
            t_engine, result = timed(lambda s=seed: generator.generate(generator.request(PROMPT, seed=s, **kwargs)))
            times["engine"].append(t_engine)
            times["png_save"].append(timed(lambda r=result, d=f"{png_dir}/{run}": r.save_pngs(d))[0])
            times["app_no_download"].append(
                timed(lambda s=seed: bare_client.predict(prompt=PROMPT, **kwargs, seed=s, **api))[0]
            )
    return {name: Stats.of(values) for name, values in times.items()}


def gradio_floor(runs: int) -> Stats:
    """Seconds per call of an echo endpoint (queue, concurrency 1) via gradio_client: what any Gradio app costs."""
    import gradio as gr
    from gradio_client import Client

    with gr.Blocks(analytics_enabled=False) as echo_demo:
        text_in, text_out = gr.Textbox(), gr.Textbox()
        text_in.submit(lambda text: text, text_in, text_out, api_name="echo", concurrency_limit=1)
    echo_demo.queue(max_size=20).launch(server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(echo_demo.local_url, verbose=False, download_files=False)  # text only: nothing to fetch
        client.predict("warm-up", api_name="/echo")
        return Stats.of([timed(lambda: client.predict("hello", api_name="/echo"))[0] for _ in range(max(runs, 5))])
    finally:
        echo_demo.close()


def drive_load(
    url: str,
    *,
    clients: int,
    requests_per_client: int,
    images_per_request: int,
    style_names: Sequence[str],
    timeout_s: float = 300,
    seed: int = 0,
    on_answer: Callable[[int], None] | None = None,
) -> LoadResult:
    """`clients` threads, each with its own Client, send random requests back to back; count every outcome."""
    from gradio_client.utils import QueueError

    download_dir = tempfile.mkdtemp(prefix="sdxl-bench-downloads-")
    pool = [make_client(url, download_dir) for _ in range(clients)]  # connecting is not part of the measurement
    lock = threading.Lock()
    latencies: list[float] = []
    failures: list[str] = []
    rejections: list[str] = []
    start = threading.Barrier(clients)

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        start.wait()
        for _ in range(requests_per_client):
            request = random_request(rng, style_names)
            sent = time.perf_counter()
            try:
                pool[index].submit(**request, api_name="/generate").result(timeout=timeout_s)
            except QueueError as exc:
                with lock:
                    rejections.append(str(exc))
            except FutureTimeout:
                with lock:
                    failures.append(f"no answer within {timeout_s:g} s")
            except Exception as exc:  # every other failure is counted, with its message
                with lock:
                    failures.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                with lock:
                    latencies.append(time.perf_counter() - sent)
                    done = len(latencies)
                if on_answer:
                    on_answer(done)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    shutil.rmtree(download_dir, ignore_errors=True)
    for client in pool:
        close = getattr(client, "close", None)
        if close:
            close()
    succeeded = len(latencies)
    return LoadResult(
        clients=clients,
        requests=clients * requests_per_client,
        succeeded=succeeded,
        failed=len(failures),
        rejected=len(rejections),
        failure_messages=sorted(set(failures)),
        rejection_messages=sorted(set(rejections)),
        wall_s=wall,
        requests_per_s=succeeded / wall,
        images_per_s=succeeded * images_per_request / wall,
        latency=Stats.of(latencies),
    )


def through_the_app(
    generator,
    *,
    runs: int,
    client_counts: Sequence[int],
    requests_per_client: int,
    max_requests: int,
    queue_size: int,
    say: Progress = progress,
) -> ServingResult:
    """Serving overhead of one call, then load at each concurrency level (requests capped at max_requests)."""
    from ..engine import load_styles

    style_names = list(load_styles())
    compiles_before = generator.compile_count
    page = launch_app(generator, queue_size)
    download_dir = tempfile.mkdtemp(prefix="sdxl-bench-downloads-")
    try:
        say(f"app: serving on {page.local_url}; {runs} interleaved app/engine calls ...")
        from gradio_client import Client

        bare = Client(page.local_url, verbose=False, download_files=False)
        stats = serving_overhead(generator, make_client(page.local_url, download_dir), bare, runs)
        engine, app_stats = stats["engine"], stats["app"]
        overhead = (app_stats.median - engine.median) / engine.median
        say(
            f"app: engine {engine.median:.3f} s, app {app_stats.median:.3f} s (no download "
            f"{stats['app_no_download'].median:.3f} s, PNGs {stats['png_save'].median:.3f} s), overhead {overhead:+.1%}"
        )
        floor = gradio_floor(runs)
        say(f"app: Gradio's own floor (echo endpoint via gradio_client) {floor.median * 1000:.0f} ms per call")
        load = []
        for clients in client_counts:
            per_client = max(1, min(requests_per_client, max_requests // clients))
            say(f"app: {clients} concurrent clients x {per_client} requests ...")
            result = drive_load(
                page.local_url,
                clients=clients,
                requests_per_client=per_client,
                images_per_request=generator.num_images,
                style_names=style_names,
                seed=clients,
            )
            say(
                f"app: {clients} clients: {result.requests_per_s:.2f} req/s, {result.images_per_s:.1f} images/s, "
                f"p50 {result.latency.median:.2f} s, p95 {result.latency.p95:.2f} s, "
                f"{result.failed} failed, {result.rejected} rejected"
            )
            load.append(result)
    finally:
        close_app(page)
        shutil.rmtree(download_dir, ignore_errors=True)
    return ServingResult(
        engine=engine,
        app=app_stats,
        app_no_download=stats["app_no_download"],
        png_save=stats["png_save"],
        gradio_floor=floor,
        overhead=overhead,
        target_overhead=TARGET_OVERHEAD,
        meets_target=overhead <= TARGET_OVERHEAD,
        queue_size=queue_size,
        load=load,
        compiles_added=generator.compile_count - compiles_before,
    )
