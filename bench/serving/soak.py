"""The soak part: hold under load. Many random `/generate` requests from many concurrent clients, in process.

Checks what a long-running server must keep true: no failures (queue-full rejections are counted apart and must
carry the clean busy message), bounded resident-memory growth after a warm-up, and no recompilation.
Used by `python -m bench --only soak` and by tests/system/test_soak.py.
"""

from __future__ import annotations

import gc
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..common import Progress, Stats, progress
from .app import BUSY_MESSAGE, close_app, drive_load, launch_app

#: Resident memory the process may gain over the soak (after a warm-up) before it counts as a leak.
MAX_RSS_GROWTH_MB = 300.0


@dataclass(frozen=True)
class SoakResult:
    """Figures of one soak run."""

    requests: int  # requests sent in the measured phase
    clients: int  # concurrent clients
    queue_size: int  # the app's queue size
    succeeded: int  # answered with images
    failures: int  # failed for any reason but a full queue (must be 0)
    rejections: int  # turned away because the queue was full
    clean_rejections: bool  # every rejection carried the busy message
    failure_messages: list[str]  # distinct failure messages
    rejection_messages: list[str]  # distinct rejection messages
    latency: Stats  # seconds per successful request (client side, queueing included): median = p50, p95
    requests_per_s: float  # successful requests per second
    images_per_s: float  # images per second
    rss_before_mb: float  # resident memory after the warm-up, before the measured phase
    rss_after_mb: float  # resident memory after the measured phase (after gc)
    rss_growth_mb: float  # after - before
    rss_samples_mb: list[tuple[int, float]]  # (requests answered, RSS MiB without gc) every 50 answers: leak or plateau
    max_rss_growth_mb: float  # the bound the growth must stay under
    compiles_added: int  # XLA compilations during warm-up and soak (must be 0)
    wall_s: float  # measured phase, first request -> last answer
    images_per_request: int  # images each request returns
    shape: str  # e.g. "64x64, 2 steps, float32, 8 x cpu"

    @property
    def passed(self) -> bool:
        """True when every check holds."""
        return (
            self.failures == 0
            and self.clean_rejections
            and self.compiles_added == 0
            and self.rss_growth_mb < self.max_rss_growth_mb
            and self.succeeded > 0
        )


def current_rss_mb() -> float:
    """This process's resident memory now, MiB."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def rss_mb() -> float:
    """This process's resident memory, MiB, after a garbage collection."""
    gc.collect()
    return current_rss_mb()


def soak(
    generator,
    *,
    requests: int = 200,
    clients: int = 16,
    queue_size: int = 20,
    warmup_requests: int = 16,
    timeout_s: float = 300,
    seed: int = 0,
    say: Progress = progress,
) -> SoakResult:
    """Serve the app in process and drive `requests` random requests from `clients` concurrent clients."""
    from ..engine import load_styles

    style_names = list(load_styles())
    compiles_before = generator.compile_count
    page = launch_app(generator, queue_size)
    try:
        say(f"soak: app on {page.local_url}; warm-up with {warmup_requests} requests ...")
        drive_load(
            page.local_url,
            clients=min(clients, warmup_requests),
            requests_per_client=max(1, warmup_requests // min(clients, warmup_requests)),
            images_per_request=generator.num_images,
            style_names=style_names,
            timeout_s=timeout_s,
            seed=seed + 1,
        )
        rss_before = rss_mb()
        per_client = math.ceil(requests / clients)
        say(f"soak: RSS {rss_before:.0f} MiB; {clients} clients x {per_client} requests ...")

        samples: list[tuple[int, float]] = [(0, rss_before)]

        def report(done: int) -> None:
            if done % 50 == 0:
                samples.append((done, current_rss_mb()))
                say(f"soak: {done} requests answered, RSS {samples[-1][1]:.0f} MiB")

        load = drive_load(
            page.local_url,
            clients=clients,
            requests_per_client=per_client,
            images_per_request=generator.num_images,
            style_names=style_names,
            timeout_s=timeout_s,
            seed=seed,
            on_answer=report,
        )
        rss_after = rss_mb()
    finally:
        close_app(page)
    config = generator.config
    result = SoakResult(
        requests=load.requests,
        clients=clients,
        queue_size=queue_size,
        succeeded=load.succeeded,
        failures=load.failed,
        rejections=load.rejected,
        clean_rejections=all(BUSY_MESSAGE in message for message in load.rejection_messages),
        failure_messages=load.failure_messages,
        rejection_messages=load.rejection_messages,
        latency=load.latency,
        requests_per_s=load.requests_per_s,
        images_per_s=load.images_per_s,
        rss_before_mb=rss_before,
        rss_after_mb=rss_after,
        rss_growth_mb=rss_after - rss_before,
        rss_samples_mb=[*samples, (load.succeeded, rss_after)],
        max_rss_growth_mb=MAX_RSS_GROWTH_MB,
        compiles_added=generator.compile_count - compiles_before,
        wall_s=load.wall_s,
        images_per_request=generator.num_images,
        shape=f"{config.height}x{config.width}, {config.steps} steps, {config.dtype}, {generator.device_summary}",
    )
    say(soak_summary(result))
    return result


def soak_summary(result: SoakResult) -> str:
    """One line with every soak figure."""
    return (
        f"soak: {result.requests} requests from {result.clients} clients ({result.shape}): "
        f"{result.succeeded} ok, {result.failures} failed, {result.rejections} rejected (queue full); "
        f"p50 {result.latency.median:.2f} s, p95 {result.latency.p95:.2f} s, {result.requests_per_s:.2f} req/s; "
        f"RSS {result.rss_before_mb:.0f} -> {result.rss_after_mb:.0f} MiB ({result.rss_growth_mb:+.0f}); "
        f"{result.compiles_added} compilations; {'PASS' if result.passed else 'FAIL'}"
    )


def write_soak_json(result: SoakResult, path: Path) -> Path:
    """Write the soak figures (and whether they passed) as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**asdict(result), "passed": result.passed, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
