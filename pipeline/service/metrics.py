"""The engine's counters in Prometheus' text exposition format (`GET /metrics`), without a client library.

sdxl_engine_requests_total{outcome="ok|stopped|failed|refused"}   requests by how they ended
sdxl_engine_request_seconds                                       a histogram of the requests that ran
sdxl_engine_busy                                                  the requests running (1 while one runs)
sdxl_engine_text_cache_total{result="hit|miss"}                   requests whose text was kept / encoded
"""

from __future__ import annotations

import bisect
import threading

OUTCOMES = ("ok", "stopped", "failed", "refused")
#: Upper bounds (s) of the request-time histogram: from a few-step 512² request to a 50-step 1024² one on a CPU.
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TEXT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Thread-safe counters; `text()` renders them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes = dict.fromkeys(OUTCOMES, 0)
        self._buckets = [0] * len(BUCKETS)  # non-cumulative counts; +Inf is the total
        self._count = 0
        self._sum = 0.0
        self._busy = 0

    def finished(self, outcome: str, seconds: float | None = None) -> None:
        """A request ended with `outcome`; `seconds` it ran (None: it never ran, e.g. refused)."""
        with self._lock:
            self._outcomes[outcome] += 1
            if seconds is not None:
                index = bisect.bisect_left(BUCKETS, seconds)
                if index < len(BUCKETS):
                    self._buckets[index] += 1
                self._count += 1
                self._sum += seconds

    def busy(self, running: int) -> None:
        """The requests running now (at most one, or with --merge-requests those its calls share)."""
        with self._lock:
            self._busy = int(running)

    def text(self, text_cache: tuple[int, int] | None = None) -> str:
        """The exposition; `text_cache`: the engine's (hits, misses) of --text-cache (None: no engine yet)."""
        with self._lock:
            lines = [
                "# HELP sdxl_engine_requests_total Generation requests by how they ended.",
                "# TYPE sdxl_engine_requests_total counter",
            ]
            lines += [f'sdxl_engine_requests_total{{outcome="{name}"}} {n}' for name, n in self._outcomes.items()]
            lines += [
                "# HELP sdxl_engine_request_seconds Seconds a generation request ran (stopped ones included).",
                "# TYPE sdxl_engine_request_seconds histogram",
            ]
            total = 0
            for bound, n in zip(BUCKETS, self._buckets, strict=True):
                total += n
                lines.append(f'sdxl_engine_request_seconds_bucket{{le="{bound:g}"}} {total}')
            lines += [
                f'sdxl_engine_request_seconds_bucket{{le="+Inf"}} {self._count}',
                f"sdxl_engine_request_seconds_sum {self._sum:.6f}",
                f"sdxl_engine_request_seconds_count {self._count}",
                "# HELP sdxl_engine_busy Requests the engine runs now (more than 1 with --merge-requests).",
                "# TYPE sdxl_engine_busy gauge",
                f"sdxl_engine_busy {self._busy}",
            ]
        if text_cache is not None:
            lines += [
                "# HELP sdxl_engine_text_cache_total Requests whose text the engine had kept (hit) or encoded "
                "(miss): --text-cache.",
                "# TYPE sdxl_engine_text_cache_total counter",
                f'sdxl_engine_text_cache_total{{result="hit"}} {text_cache[0]}',
                f'sdxl_engine_text_cache_total{{result="miss"}} {text_cache[1]}',
            ]
        return "\n".join(lines) + "\n"
