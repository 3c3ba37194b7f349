"""Merged requests (`--merge-requests`): how many requests a second several users get, alone or sharing calls.

    python -m bench --only merging                                # tiny checkpoint, the bench's size, 4 per call
    python -m bench --only merging --model stabilityai/stable-diffusion-xl-base-1.0 --height 1024 --width 1024 \\
        --steps 25 --dtype bfloat16 --cpu-devices 0 --merge-slots 4    # on a TPU/GPU host

Two engines on the bench's checkpoint, size and steps, each request one image per device:
- alone: `--images-per-device 1`, every request its own call (the Space's way);
- merged: `--images-per-device N --merge-requests`: up to N waiting requests share a call, of 1, 2, 4 ... or N
  images per device (the largest the waiting requests fill: `EngineConfig.merge_call_sizes`);
- and, for a lone request's latency only, `--merge-full-calls`: every call N images per device.
`clients` threads (2 N: as many as the page lets in at once) each send requests back to back, every request with its
own prompt and seed; a round is `clients × requests_per_client` requests, rounds of the two engines alternate so drift
on a shared machine hits both alike. Figures: requests per second, per-request latency, the calls made and the
requests per call (and the calls of each size); then one request at a time, the latency of a lone request on each
engine: what merging costs a user who arrives while the devices are idle. On a CPU, where a call's time grows with its
images, merging gains little; an accelerator's larger products run nearer its rate (issue 46's matrix-product table),
which is what merging is for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ..common import Progress, Stats, progress

PROMPTS = (
    "a lighthouse at dusk",
    "a bowl of lemons on a table",
    "a cabin in the snow",
    "a red kite over dunes",
    "a city street in the rain",
    "a portrait of an old sailor",
    "a field of sunflowers",
    "a steam train",
)


@dataclass(frozen=True)
class MergedServing:
    """Requests per second and latency of one-call-per-request against merged calls, same checkpoint and size."""

    model: str
    height: int
    width: int
    steps: int
    images_per_request: int  # one per device
    slots: int  # N: requests a merged call holds (--images-per-device N)
    clients: int  # threads sending requests at once
    requests_per_round: int
    alone_requests_per_s: Stats  # per round
    merged_requests_per_s: Stats
    alone_latency_s: Stats  # per request, all rounds
    merged_latency_s: Stats
    merged_requests_per_call: float  # requests of the merged rounds / their calls
    merged_calls_by_size: dict[int, int]  # the merged rounds' calls, per requests in them
    lone_latency_s: dict[str, Stats]  # one request at a time: "alone", "merged", "full calls" (--merge-full-calls)
    speedup: float  # merged / alone median requests per second
    compiles_during_runs: int  # must be 0


def _engine(args, **settings):
    from ..engine import Generator

    generator = Generator.from_pretrained(
        args.model, height=args.height, width=args.width, steps=args.steps, dtype=args.dtype, **settings
    )
    generator.warmup()
    return generator


def _round(generator, clients: int, per_client: int, seed: int) -> tuple[float, list[float]]:
    """`clients` threads, `per_client` requests each: (requests per second, each request's seconds)."""
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for k in range(per_client):
            number = index * per_client + k
            request = generator.request(PROMPTS[number % len(PROMPTS)], seed=seed + 1000 * number)
            started = time.perf_counter()
            try:
                generator.generate(request)
            except BaseException as exc:  # reported after the round
                failures.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failures:
        raise failures[0]
    return len(latencies) / seconds, latencies


def merged_serving(
    args, slots: int, runs: int, per_client: int = 2, say: Progress = progress, settings: dict | None = None
) -> MergedServing:
    """The engines, then `runs` rounds of each, alternating (after one untimed round each), then `runs` × 3 lone
    requests on each, alternating. `settings`: the three engines' other settings (`Generator.from_pretrained`'s;
    the tests' fewest programs, on fewer devices), else the defaults, on every device."""
    from ..engine import CompileCounter

    settings = settings or {}
    alone = _engine(args, **settings)
    merged = _engine(args, per_device_batch=slots, merge_requests=True, **settings)
    full = _engine(args, per_device_batch=slots, merge_requests=True, merge_full_calls=True, **settings)
    clients = merged.concurrency  # 2 N
    for generator in (alone, merged):
        _round(generator, clients, 1, seed=0)  # untimed: threads and caches warm
    compiles_before = CompileCounter.compiles()
    calls_before, sizes_before = merged.merger.calls, dict(merged.merger.calls_by_size)
    rates: dict[str, list[float]] = {"alone": [], "merged": []}
    latencies: dict[str, list[float]] = {"alone": [], "merged": []}
    for run in range(runs):
        for name, generator in (("alone", alone), ("merged", merged)):
            rate, seconds = _round(generator, clients, per_client, seed=run)
            rates[name].append(rate)
            latencies[name] += seconds
    calls = merged.merger.calls - calls_before
    by_size = {n: count - sizes_before.get(n, 0) for n, count in sorted(merged.merger.calls_by_size.items())}
    requests = runs * clients * per_client
    lone: dict[str, list[float]] = {"alone": [], "merged": [], "full calls": []}
    for number in range(3 * runs):
        for name, generator in (("alone", alone), ("merged", merged), ("full calls", full)):
            lone[name] += _round(generator, 1, 1, seed=10_000 + number)[1]
    result = MergedServing(
        model=args.model,
        height=args.height,
        width=args.width,
        steps=args.steps,
        images_per_request=merged.num_images,
        slots=slots,
        clients=clients,
        requests_per_round=clients * per_client,
        alone_requests_per_s=Stats.of(rates["alone"]),
        merged_requests_per_s=Stats.of(rates["merged"]),
        alone_latency_s=Stats.of(latencies["alone"]),
        merged_latency_s=Stats.of(latencies["merged"]),
        merged_requests_per_call=requests / calls if calls else 0.0,
        merged_calls_by_size={n: count for n, count in by_size.items() if count},
        lone_latency_s={name: Stats.of(seconds) for name, seconds in lone.items()},
        speedup=Stats.of(rates["merged"]).median / Stats.of(rates["alone"]).median,
        compiles_during_runs=CompileCounter.compiles() - compiles_before,
    )
    say(
        f"merging: {result.alone_requests_per_s.median:.2f} requests/s alone, "
        f"{result.merged_requests_per_s.median:.2f} merged ({result.merged_requests_per_call:.2f} per call): "
        f"{result.speedup:.2f}x; latency {result.alone_latency_s.median:.3f} s vs "
        f"{result.merged_latency_s.median:.3f} s; alone at idle {result.lone_latency_s['alone'].median:.3f} s, "
        f"merged {result.lone_latency_s['merged'].median:.3f} s, with full calls "
        f"{result.lone_latency_s['full calls'].median:.3f} s"
    )
    return result
