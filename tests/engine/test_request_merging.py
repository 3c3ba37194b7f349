"""--merge-requests (pipeline/host/merging.py): queued text-to-image requests share one device call, each in its own
block of the batch with its own prompt, seed and guidance, and gets the pixels it gets alone; Stop ends one request
of a call at once while the others go on; requests that cannot share run alone. The merger's queue and watchers are
checked on their own first (no JAX), then the engine's calls on 2 CPU devices × 2 images.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from conftest import BATCHED_DEVICES, BATCHED_SETTINGS, engine_service, generate
from PIL import Image

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.contract.stopping import Stopped
from pipeline.host.merging import CallMerger, GroupWatchers, Ticket
from web.options import parse_args

#: How long a test waits for a thread it started (a busy machine is slow; an event ends the wait sooner).
PATIENCE_S = 300


def _ticket(key, **listeners) -> Ticket:
    return Ticket(key, (np.zeros((2, 1)),), total=4, **listeners)


def _in_thread(function, *args) -> tuple[threading.Thread, dict]:
    """`function(*args)` in a started thread; its outcome lands in the dict ("value" or "error")."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


# ---- the queue and the watchers, without JAX ------------------------------------------------------------------------


def test_a_call_takes_the_oldest_requests_key_up_to_its_slots():
    calls: list[list[str]] = []
    first_running, release = threading.Event(), threading.Event()

    def run_group(tickets):
        calls.append([ticket.request for ticket in tickets])
        if len(calls) == 1:
            first_running.set()
            release.wait(PATIENCE_S)
        for ticket in tickets:
            ticket.answer(np.full((2, 1), len(calls)), 0.0)

    merger = CallMerger(2, run_group)
    threads = [_in_thread(merger.submit, Ticket("a", (), 1, "first"))]
    assert first_running.wait(PATIENCE_S)
    for name, key in (("b1", "b"), ("a1", "a"), ("b2", "b"), ("b3", "b"), ("a2", "a")):
        threads.append(_in_thread(merger.submit, Ticket(key, (), 1, name)))
        assert merger.wait_for_waiting(len(threads) - 1, PATIENCE_S)  # queued in this order
    release.set()
    for thread, _ in threads:
        thread.join(PATIENCE_S)
    # The oldest waiting request's key picks each call; a call holds at most 2.
    assert calls == [["first"], ["b1", "b2"], ["a1", "a2"], ["b3"]]
    assert [int(outcome["value"][0][0, 0]) for _, outcome in threads] == [1, 2, 3, 2, 4, 3]
    assert (merger.calls, merger.merged) == (4, 4)


def test_a_failed_call_answers_its_requests_with_the_error_and_the_next_call_runs():
    def run_group(tickets):
        if tickets[0].key == "bad":
            raise RuntimeError("the devices failed")
        for ticket in tickets:
            ticket.answer(np.ones((2, 1)), 0.5)

    merger = CallMerger(2, run_group)
    with pytest.raises(RuntimeError, match="the devices failed"):
        merger.submit(_ticket("bad"))
    pixels, device_s = merger.submit(_ticket("good"))
    assert pixels.shape == (2, 1) and device_s == 0.5


def test_the_watchers_give_each_request_its_own_progress_previews_and_stop():
    seen: dict[str, list] = {"a": [], "b": []}
    stop_b = threading.Event()
    a = _ticket("k", on_step=lambda done, total: seen["a"].append(done),
                on_preview=lambda done, total, rows: seen["a"].append(rows[:, 0].tolist()))  # fmt: skip
    b = _ticket("k", on_step=lambda done, total: seen["b"].append(done), should_stop=stop_b.is_set)
    watchers = GroupWatchers([a, b], block=2)
    assert watchers.previews
    assert watchers.gate(0, False) is False
    watchers.on_step(1, 4)
    watchers.on_preview(1, 4, np.arange(4)[:, None])  # rows 0, 1: a's block; 2, 3: b's (b watches none)
    stop_b.set()
    assert watchers.gate(1, False) is False  # b ends now; a's call goes on
    assert not b.live
    with pytest.raises(Stopped) as stopped:
        b.wait()
    assert (stopped.value.done, stopped.value.total) == (1, 4)
    watchers.on_step(2, 4)
    watchers.answer(np.arange(4)[:, None], 1.5)
    pixels, device_s = a.wait()
    assert pixels[:, 0].tolist() == [0, 1] and device_s == 1.5
    assert seen == {"a": [1, [0, 1], 2], "b": [1]}
    # When every request of a call has stopped, the gate stops the call.
    c = _ticket("k", should_stop=lambda: True)
    assert GroupWatchers([c], block=2).gate(3, False) is True and not c.live


# ---- the engine --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def merging_engine(tiny_dir):
    """`batched_engine`'s settings (2 devices × 2 images per call) with --merge-requests: 2 images per request, two
    requests per call."""
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(str(tiny_dir), devices=jax.devices()[:BATCHED_DEVICES],
                                          merge_requests=True, **BATCHED_SETTINGS)  # fmt: skip
    generator.warmup()
    return generator


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images])


def _while_busy(engine, started: threading.Event, queued: int):
    """An on_step listener that, at the first step, says the call is running and holds it until `queued` requests
    wait for the next call (so they share one)."""

    def on_step(done, total):
        if done == 1:
            started.set()
            assert engine.merger.wait_for_waiting(queued, PATIENCE_S)

    return on_step


REQUESTS = [  # (prompt, fields): the same size and UNet calls, everything else their own (sampler and schedule too)
    ("a lighthouse at dusk", dict(seed=7, guidance_scale=5.0)),
    ("a bowl of lemons", dict(seed=1234, guidance_scale=8.0, negative_prompt="blurry", sampler="DPM++ 2M",
                              schedule_type="Karras")),
    ("a cabin in the snow, (warm light:1.3)", dict(seed=99, guidance_scale=1.0, sampler="Euler a")),
]


def test_queued_requests_share_a_call_and_get_the_pixels_they_get_alone(merging_engine, batched_engine):
    engine = merging_engine
    assert (engine.num_images, engine.images_per_call, engine.concurrency) == (2, 4, 4)
    alone = [_pixels(generate(engine, prompt, **fields)) for prompt, fields in REQUESTS]
    # Alone, a request's images are the first of a call without merging (image i: seed + i).
    for (prompt, fields), pixels in zip(REQUESTS, alone, strict=True):
        assert pixels.shape == (2, 64, 64, 3)
        np.testing.assert_array_equal(pixels, _pixels(generate(batched_engine, prompt, **fields))[:2])
    calls, merged, compiles = engine.merger.calls, engine.merger.merged, engine.compile_count
    started = threading.Event()
    first = _in_thread(lambda: engine.generate(engine.request(REQUESTS[0][0], **REQUESTS[0][1]),
                                               on_step=_while_busy(engine, started, 2)))  # fmt: skip
    assert started.wait(PATIENCE_S)
    others = [_in_thread(lambda p=prompt, f=fields: generate(engine, p, **f)) for prompt, fields in REQUESTS[1:]]
    for thread, _ in (first, *others):
        thread.join(PATIENCE_S)
    results = [outcome["value"] for _, outcome in (first, *others)]
    # Two calls: the first alone (the devices were idle), then the two queued requests in one.
    assert (engine.merger.calls - calls, engine.merger.merged - merged) == (2, 2)
    assert engine.recent_runs[-1]["requests"] == 2
    assert engine.compile_count == compiles
    for result, pixels, (prompt, fields) in zip(results, alone, REQUESTS, strict=True):
        np.testing.assert_array_equal(_pixels(result), pixels)
        assert result.seeds == [fields["seed"], fields["seed"] + 1]
        assert f"Seed: {fields['seed']}," in result.parameters[0] and prompt in result.prompt


def test_requests_share_a_call_when_they_make_as_many_unet_calls(merging_engine):
    """The sampler, schedule and steps are each image's own rows; what must agree is the number of UNet calls (a
    row each) and what fixes the programs and weights."""
    engine = merging_engine

    def key(**fields):
        request = engine.request("a lighthouse", **fields)
        plan = engine._plans(request)[0]
        arrays, k, _, extra = engine._host_rows(request, [0, 1])
        return engine._merge_key(request, plan.rows, k, extra)

    euler = key(steps=4)
    assert key(steps=4, sampler="DPM++ 2M SDE", schedule_type="Karras", guidance_scale=9, seed=3) == euler
    assert key(steps=2, sampler="Heun") == key(steps=3)  # Heun: two calls a step but the last: 3 rows
    for other in (dict(steps=5), dict(steps=4, clip_skip=2), dict(steps=4, sampler="Heun")):
        assert key(**other) != euler, other


def test_stop_ends_one_request_of_a_merged_call_and_the_other_finishes(merging_engine):
    engine = merging_engine
    (prompt, fields), (other_prompt, other_fields) = REQUESTS[0], REQUESTS[1]
    other_fields = {**other_fields, "steps": 4}  # the merged pair's steps: with 2, the Stop would come after the last
    alone = _pixels(generate(engine, other_prompt, **other_fields))
    started, stop = threading.Event(), threading.Event()
    steps_seen: list[int] = []

    def stopping_at_1(done, total):  # Stop pressed once the first step is shown (the second is under way)
        steps_seen.append(done)
        stop.set()

    first = _in_thread(lambda: engine.generate(engine.request(prompt, **fields),
                                               on_step=_while_busy(engine, started, 2)))  # fmt: skip
    assert started.wait(PATIENCE_S)
    stopped = _in_thread(lambda: engine.generate(engine.request(prompt, seed=5, steps=4), on_step=stopping_at_1,
                                                 should_stop=stop.is_set))  # fmt: skip
    finished = _in_thread(lambda: generate(engine, other_prompt, **other_fields))
    for thread, _ in (first, stopped, finished):
        thread.join(PATIENCE_S)
    assert isinstance(stopped[1].get("error"), Stopped) and stopped[1]["error"].done == 2 and steps_seen == [1]
    np.testing.assert_array_equal(_pixels(finished[1]["value"]), alone)
    assert engine.recent_runs[-1]["requests"] == 2 and not engine.recent_runs[-1]["stopped"]


def test_a_request_that_cannot_share_runs_alone_with_one_image_per_device(merging_engine, batched_engine):
    picture = Image.fromarray(np.tile(np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], (64, 1, 3)))  # a ramp
    fields = dict(seed=31, init_image=picture, strength=0.6)
    calls = merging_engine.merger.calls
    result = generate(merging_engine, "a watercolour of the same ramp", **fields)
    assert merging_engine.merger.calls == calls  # image to image: not through the merger
    assert result.seeds == [31, 32]
    full = _pixels(generate(batched_engine, "a watercolour of the same ramp", **fields))
    np.testing.assert_array_equal(_pixels(result), full[:2])


def test_merging_needs_two_images_per_device_and_one_process():
    with pytest.raises(InvalidInput, match="--merge-requests needs --images-per-device 2 or more"):
        EngineConfig(model="tiny", merge_requests=True)
    assert EngineConfig(model="tiny", merge_requests=True, per_device_batch=4).merge_requests
    config = parse_args(["--model", "tiny", "--images-per-device", "3", "--merge-requests"]).config
    assert config.merge_requests and config.per_device_batch == 3
    assert not parse_args(["--model", "tiny"]).config.merge_requests


def test_an_engine_service_takes_the_requests_its_merged_calls_share(merging_engine):
    """`python -m pipeline serve` around a merging engine (in this process) and a page's client of it: the info says
    4 requests at once, the page's pool sends 3 while the devices are held, and the two that waited share a call."""
    from pipeline.contract.request import parse_request

    engine = merging_engine
    alone = {prompt: _pixels(generate(engine, prompt, **fields)) for prompt, fields in REQUESTS}
    with engine_service(engine) as remote:
        assert (remote.num_images, remote.concurrency, remote.pool.slots(remote.pool.ready[0])) == (2, 4, 4)
        calls, merged = engine.merger.calls, engine.merger.merged
        requests = [parse_request(prompt, rules=engine.rules, **fields) for prompt, fields in REQUESTS]
        with engine._device_lock:  # the first request's call waits for the devices; the others queue behind it
            sent = [_in_thread(remote.generate, requests[0])]
            assert engine.merger.wait_until(lambda: engine.merger.calls == calls + 1, PATIENCE_S)
            sent += [_in_thread(remote.generate, request) for request in requests[1:]]
            assert engine.merger.wait_for_waiting(2, PATIENCE_S)
        for thread, _ in sent:
            thread.join(PATIENCE_S)
        assert (engine.merger.calls - calls, engine.merger.merged - merged) == (2, 2)
        for (_, outcome), (prompt, fields) in zip(sent, REQUESTS, strict=True):
            result = outcome["value"]
            assert result.seeds == [fields["seed"], fields["seed"] + 1]
            np.testing.assert_array_equal(np.stack([np.asarray(image.convert("RGB")) for image in result.images]),
                                          alone[prompt])  # fmt: skip
