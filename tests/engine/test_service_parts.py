"""The engine service's parts that need no engine: the wire format both ways, the request check at the engine's
edge, the token, the metrics' text, and the page's engine addresses. No JAX, no process."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import free_port
from PIL import Image

from pipeline.contract.errors import EngineUnavailable, InvalidInput
from pipeline.contract.request import RequestRules, parse_request
from pipeline.service import auth, wire
from pipeline.service.info import disagreement
from pipeline.service.metrics import Metrics
from web.engines.pool import EnginePool, NoEngine, parse_engine_url, resolve
from web.engines.remote import ENGINE_LOST, ONLY_ENGINE, EngineFailed, waiting_text

RULES = RequestRules(sizes=((64, 64), (64, 128)), loras=("my-style", "other"))


def test_a_page_request_comes_back_equal_at_the_engine_and_a_bare_one_gets_the_engines_defaults():
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 128, 3), dtype=np.uint8))
    sent = parse_request(
        "a cat <lora:my-style:0.5>",
        "blurry",
        "Cinematic",
        seed=7,
        size=(64, 128),
        loras=[["other", 0.7]],
        init_image=picture,
        rules=RULES,
        steps=9,
        strength=0.6,
    )
    received = wire.request_from_wire(json.loads(json.dumps(sent.to_dict())), RULES)
    assert received == sent and received.picture().pixels.shape == (64, 128, 3)
    assert [name for name, *_ in received.loras] == ["my-style", "other"]  # the tag's and the list's, once each
    bare = wire.request_from_wire({"prompt": "a cat"}, RULES)
    assert bare == parse_request("a cat", rules=RULES)


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        ([], "The body must be a JSON object"),
        ({"prompt": "a cat", "bogus": 1}, "Unknown request field 'bogus'"),
        ({"prompt": ""}, "Please enter a prompt."),
        ({"prompt": "a cat", "size": [32, 32]}, "64"),
        ({"prompt": "a cat", "init_image": "not base64!"}, "init_image must be a base64-encoded PNG."),
        ({"prompt": "a cat", "loras": [["third", 1.0]]}, "Unknown LoRA"),
    ],
)
def test_bad_input_at_the_engines_edge_is_one_sentence(body, sentence):
    with pytest.raises(InvalidInput, match=re.escape(sentence)):
        wire.request_from_wire(body, RULES)


def test_results_and_previews_travel_with_their_pixels_and_parameters():
    class Result:
        images = [Image.fromarray(np.full((8, 8, 3), i * 40, np.uint8)) for i in range(2)]
        parameters = ["a cat\nSteps: 2, Seed: 1", "a cat\nSteps: 2, Seed: 2"]
        seeds, prompt, negative_prompt, truncated, timings, steps, sampler = (
            [1, 2],
            "a cat",
            "",
            "",
            {"total_s": 0.1},
            2,
            "Euler",
        )

    event = json.loads(wire.result_line(Result()))
    back = wire.RemoteResult.of(event)
    assert [np.asarray(im).tolist() for im in back.images] == [np.asarray(im).tolist() for im in Result.images]
    assert [im.info["parameters"] for im in back.images] == Result.parameters and back.seeds == [1, 2]
    pixels = np.random.default_rng(1).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    assert np.array_equal(wire.preview_pixels(json.loads(wire.previews_line(2, 4, pixels))), pixels)


def test_the_token():
    assert auth.authorized(None, None) and auth.authorized("Bearer s3cret", "s3cret")
    assert not auth.authorized(None, "s3cret") and not auth.authorized("Bearer nope", "s3cret")
    assert not auth.authorized("Basic s3cret", "s3cret")
    assert auth.listen_problem("127.0.0.1", None) is None and auth.listen_problem("::1", None) is None
    assert auth.listen_problem("localhost", None) is None and auth.listen_problem("0.0.0.0", "t") is None
    assert "--engine-token" in auth.listen_problem("0.0.0.0", None)
    assert "--engine-token" in auth.listen_problem("engine.example", None)


def test_the_metrics_text_is_prometheus_exposition():
    metrics = Metrics()
    metrics.finished("ok", 0.3)
    metrics.finished("stopped", 7.0)
    metrics.finished("refused")
    metrics.busy(1)
    text = metrics.text()
    assert 'sdxl_engine_requests_total{outcome="ok"} 1' in text
    assert 'sdxl_engine_requests_total{outcome="refused"} 1' in text
    assert 'sdxl_engine_request_seconds_bucket{le="0.25"} 0' in text
    assert 'sdxl_engine_request_seconds_bucket{le="0.5"} 1' in text
    assert 'sdxl_engine_request_seconds_bucket{le="10"} 2' in text
    assert 'sdxl_engine_request_seconds_bucket{le="+Inf"} 2' in text and "sdxl_engine_request_seconds_count 2" in text
    assert "sdxl_engine_busy 1" in text and "text_cache" not in text  # no engine yet: no cache to count
    text = metrics.text(text_cache=(3, 1))
    assert 'sdxl_engine_text_cache_total{result="hit"} 3' in text
    assert 'sdxl_engine_text_cache_total{result="miss"} 1' in text
    for line in text.splitlines():  # every sample line: name{labels} value
        assert line.startswith("# ") or re.fullmatch(r"[a-z_]+(\{[a-z]+=\"[^\"]+\"\})? [0-9.e+-]+", line), line


def test_engine_addresses():
    assert parse_engine_url("engine:7870") == ("http://engine:7870", "engine", 7870)
    assert parse_engine_url("http://10.0.0.2:7870/")[0] == "http://10.0.0.2:7870"
    for bad in ("https://engine:7870", "http://engine:7870/v1", "ftp://x"):
        with pytest.raises(ValueError, match="expected http://HOST:PORT"):
            parse_engine_url(bad)
    assert [e.address for e in resolve("http://localhost:7870")] == ["127.0.0.1"]  # one engine, not one per family
    assert resolve("http://no-such-host.invalid:7870") == []


def test_engines_that_disagree_are_named():
    info = {"model": "tiny", "sizes": [[64, 64]], "samplers": ["Euler"], "num_images": 2}
    assert disagreement(info, dict(info)) is None
    assert disagreement(info, {**info, "sizes": [[128, 128]]}) == "sizes: [[64, 64]] vs [[128, 128]]"


def test_a_request_with_no_engine_ready_is_told_what_it_waits_for_then_gets_one_sentence():
    """An engine address nobody listens on: the pool knows one engine, none ready. A request waiting for one is told
    so ("0 of 1 ready"), once; past its wait it gets NoEngine, a sentence for the visitor (EngineUnavailable: the
    page says it, no traceback); with no wait at all (a re-run), at once."""
    pool = EnginePool([f"http://127.0.0.1:{free_port()}"], probe_s=3600).start()  # probed once, not again
    try:
        told = []
        with pytest.raises(NoEngine, match=r"^No engine is available .*please try again shortly\.$") as caught:
            pool.acquire(lambda: False, give_up_s=0.3, on_wait=lambda *counts: told.append(counts))
        assert isinstance(caught.value, EngineUnavailable) and told == [(0, 1)]
        assert waiting_text(*told[0]) == "waiting for an engine (0 of 1 ready)"
        assert waiting_text(1, 2) == "waiting for a free engine (1 of 2 ready, all busy)"
        told.clear()
        with pytest.raises(NoEngine):
            pool.acquire(lambda: False, give_up_s=0.0, on_wait=lambda *counts: told.append(counts))
        assert told == []  # no wait, so nothing said about one
        assert pool.acquire(lambda: True, give_up_s=60) is None  # Stop while it waits
    finally:
        pool.close()


def test_an_engine_lost_mid_request_is_said_without_its_address():
    lost = EngineFailed(
        "connection lost", "RemoteDisconnected('Remote end closed connection without response')", [88, 100]
    )
    assert "RemoteDisconnected" in str(lost)  # the log's detail
    assert ENGINE_LOST.format(why=lost.why, then=ONLY_ENGINE) == (
        "The engine stopped mid-request (connection lost at step 88 / 100) and no other engine is ready to run it "
        "again; please try again."
    )
    unsent = EngineFailed("could not send the request", "ConnectionRefusedError(111, 'Connection refused')")
    assert unsent.why == "could not send the request before its first step"
