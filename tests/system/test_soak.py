"""Hold under load: 200+ random `/generate` requests from 16 concurrent API clients against the in-process app.

Run apart with `python -m pytest -m soak -s` (excluded from the default run). The same figures come from
`python -m bench --only soak`. Figures are printed and written to artifacts/soak.json.
"""

from __future__ import annotations

import pytest
from conftest import REPO

from bench.serving.app import BUSY_MESSAGE
from bench.serving.soak import MAX_RSS_GROWTH_MB, soak, soak_summary, write_soak_json

ARTIFACT = REPO / "artifacts" / "soak.json"
REQUESTS = 208  # 16 clients x 13 requests
CLIENTS = 16
QUEUE_SIZE = 8  # smaller than the number of clients, so the queue fills and the busy path is exercised too


@pytest.mark.soak
def test_app_holds_under_load(engine):
    result = soak(engine, requests=REQUESTS, clients=CLIENTS, queue_size=QUEUE_SIZE, timeout_s=300)
    write_soak_json(result, ARTIFACT)
    print("\n" + soak_summary(result) + f"\nwritten to {ARTIFACT}")

    assert result.requests >= 200 and result.clients == CLIENTS
    assert result.failures == 0, result.failure_messages
    assert result.succeeded + result.rejections == result.requests
    assert result.rejections > 0 and result.succeeded >= REQUESTS // 2  # busy answers happen, most requests served
    assert all(BUSY_MESSAGE in message for message in result.rejection_messages), result.rejection_messages
    assert result.compiles_added == 0
    assert result.rss_growth_mb < MAX_RSS_GROWTH_MB, f"RSS grew {result.rss_growth_mb:.0f} MiB"
    assert result.latency.p95 >= result.latency.median > 0
