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


def _calls_while_held(sizes: tuple[int, ...], queued: list[tuple[str, str]]):
    """A merger of call `sizes` whose first call ("first", key "a") holds the devices while `queued` (name, key)
    requests queue in that order, then ends: (the merger, each call's request names, each request's thread and
    outcome: pixels that say which call answered it)."""
    calls: list[list[str]] = []
    first_running, release = threading.Event(), threading.Event()

    def run_group(tickets):
        calls.append([ticket.request for ticket in tickets])
        if len(calls) == 1:
            first_running.set()
            release.wait(PATIENCE_S)
        for ticket in tickets:
            ticket.answer(np.full((2, 1), len(calls)), 0.0)

    merger = CallMerger(sizes, run_group)
    threads = [_in_thread(merger.submit, Ticket("a", (), 1, "first"))]
    assert first_running.wait(PATIENCE_S)
    for name, key in queued:
        threads.append(_in_thread(merger.submit, Ticket(key, (), 1, name)))
        assert merger.wait_for_waiting(len(threads) - 1, PATIENCE_S)  # queued in this order
    release.set()
    for thread, _ in threads:
        thread.join(PATIENCE_S)
    return merger, calls, threads


def test_a_call_takes_the_oldest_requests_key_up_to_its_slots():
    queued = [("b1", "b"), ("a1", "a"), ("b2", "b"), ("b3", "b"), ("a2", "a")]
    merger, calls, threads = _calls_while_held((1, 2), queued)  # the call sizes of N = 2
    # The oldest waiting request's key picks each call; a call holds at most 2.
    assert calls == [["first"], ["b1", "b2"], ["a1", "a2"], ["b3"]]
    assert [int(outcome["value"][0][0, 0]) for _, outcome in threads] == [1, 2, 3, 2, 4, 3]
    assert (merger.calls, merger.merged) == (4, 4)
    assert merger.calls_by_size == {1: 2, 2: 2}


def test_a_call_is_the_largest_size_the_waiting_requests_fill():
    """Calls of 1, 2 or 4 requests (N = 4): five waiting take four and then one, three take two and then one; no
    call is padded with blocks nobody asked for."""
    queued = [(name, name[0]) for name in ("a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3")]
    merger, calls, _ = _calls_while_held((1, 2, 4), queued)
    assert calls == [["first"], ["a1", "a2", "a3", "a4"], ["a5"], ["b1", "b2"], ["b3"]]
    assert merger.calls_by_size == {1: 3, 2: 1, 4: 1}
    # --merge-full-calls: the one size is N; a lone request is a call of one (its runner pads it).
    full, calls, _ = _calls_while_held((4,), [("a1", "a")])
    assert calls == [["first"], ["a1"]] and full.calls_by_size == {1: 2}
    for sizes in ((1, 4, 2), (0, 1), ()):
        with pytest.raises(ValueError, match="positive and ascend"):
            CallMerger(sizes, lambda tickets: None)


def test_a_failed_call_answers_its_requests_with_the_error_and_the_next_call_runs():
    def run_group(tickets):
        if tickets[0].key == "bad":
            raise RuntimeError("the devices failed")
        for ticket in tickets:
            ticket.answer(np.ones((2, 1)), 0.5)

    merger = CallMerger((1, 2), run_group)
    with pytest.raises(RuntimeError, match="the devices failed"):
        merger.submit(_ticket("bad"))
    pixels, device_s = merger.submit(_ticket("good"))
    assert pixels.shape == (2, 1) and device_s == 0.5


def test_the_watchers_give_each_request_its_own_progress_previews_and_stop():
    seen: dict[str, list] = {"a": [], "b": []}
    stop_b = threading.Event()
    a = _ticket(
        "k",
        on_step=lambda done, total: seen["a"].append(done),
        on_preview=lambda done, total, rows: seen["a"].append(rows[:, 0].tolist()),
    )
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

    generator = Generator.from_pretrained(
        str(tiny_dir),
        devices=jax.devices()[:BATCHED_DEVICES],
        merge_requests=True,
        hires_scales=(1.5,),
        **BATCHED_SETTINGS,
    )
    generator.warmup()
    return generator


RAMP = Image.fromarray(np.tile(np.linspace(0, 255, 64, dtype=np.uint8)[None, :, None], (64, 1, 3)))
CHECKS = Image.fromarray((np.indices((64, 64)).sum(0) // 8 % 2 * 200 + 30).astype(np.uint8)).convert("RGB")
LEFT_HALF = Image.fromarray(np.where(np.arange(64)[None, :] < 32, 255, 0).astype(np.uint8).repeat(64, 0))
PICTURES = [  # (prompt, fields): 4 steps at strengths that run 2 of them each; their own pictures, masks and samplers
    ("a watercolour of the same ramp", dict(seed=31, init_image=RAMP, strength=0.6)),
    (
        "a chessboard in the rain",
        dict(seed=8, init_image=CHECKS, mask_image=LEFT_HALF, strength=0.5, sampler="DPM++ 2M", guidance_scale=7.0),
    ),
]


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images])


def _within_one_level(got: np.ndarray, expected: np.ndarray) -> None:
    """A call of another size: the same images up to float rounding of another batch (throughput mode's bound)."""
    assert got.shape == expected.shape and np.abs(got.astype(int) - expected).max() <= 1


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
    (
        "a bowl of lemons",
        dict(seed=1234, guidance_scale=8.0, negative_prompt="blurry", sampler="DPM++ 2M", schedule_type="Karras"),
    ),
    ("a cabin in the snow, (warm light:1.3)", dict(seed=99, guidance_scale=1.0, sampler="Euler a")),
]


def test_queued_requests_share_a_call_and_get_the_pixels_they_get_alone(merging_engine, batched_engine):
    engine = merging_engine
    assert (engine.num_images, engine.images_per_call, engine.concurrency) == (2, 4, 4)
    alone = [_pixels(generate(engine, prompt, **fields)) for prompt, fields in REQUESTS]
    # In a call of two (N), a request's images are bit for bit the first of a call without merging (image i: seed +
    # i); alone it runs a call of one image per device, within 1 level of those.
    full = [_pixels(generate(batched_engine, prompt, **fields))[:2] for prompt, fields in REQUESTS]
    for pixels, expected in zip(alone, full, strict=True):
        assert pixels.shape == (2, 64, 64, 3)
        _within_one_level(pixels, expected)
    calls, merged, compiles = engine.merger.calls, engine.merger.merged, engine.compile_count
    started = threading.Event()
    first = _in_thread(
        lambda: engine.generate(
            engine.request(REQUESTS[0][0], **REQUESTS[0][1]), on_step=_while_busy(engine, started, 2)
        )
    )
    assert started.wait(PATIENCE_S)
    others = [_in_thread(lambda p=prompt, f=fields: generate(engine, p, **f)) for prompt, fields in REQUESTS[1:]]
    for thread, _ in (first, *others):
        thread.join(PATIENCE_S)
    results = [outcome["value"] for _, outcome in (first, *others)]
    # Two calls: the first alone (the devices were idle: one image per device), then the two queued requests in one.
    assert (engine.merger.calls - calls, engine.merger.merged - merged) == (2, 2)
    assert [(run["requests"], run["images_per_device"]) for run in list(engine.recent_runs)[-2:]] == [(1, 1), (2, 2)]
    assert engine.compile_count == compiles
    for result, pixels, (prompt, fields) in zip(results, [alone[0], *full[1:]], REQUESTS, strict=True):
        np.testing.assert_array_equal(_pixels(result), pixels)
        assert result.seeds == [fields["seed"], fields["seed"] + 1]
        assert f"Seed: {fields['seed']}," in result.parameters[0] and prompt in result.prompt


def test_a_lone_request_runs_a_one_image_call_and_a_kept_text_serves_each_call_size(merging_engine):
    """The warm-up compiled the 1-image call's programs (text or picture to image) beside N's; a request alone runs
    them (no blocks padded), and a text kept from it is kept apart from the same text in a call of two requests
    (whose encoded text has twice the rows): both get the pixels of the request alone."""
    engine = merging_engine
    assert sorted(engine.call_programs) == [1, 2] and engine.call_programs[2] is engine.programs
    small = engine.call_programs[1]
    assert small.batch == BATCHED_DEVICES and all(small.is_compiled(key) for key in engine.merged_program_keys())
    kinds = {key.kind for key in engine.merged_program_keys()}
    assert {"encode", "encode_image", "start", "decode"} <= kinds and not kinds & {"merge", "step_control", "upscale"}
    assert {key.height for key in engine.merged_program_keys() if key.height} == {64}  # not the hires fix's 96
    prompt = "a red kite over the dunes"
    compiles, ones = engine.compile_count, engine.merger.calls_by_size[1]
    alone = {seed: _pixels(generate(engine, prompt, seed=seed)) for seed in (3, 4)}  # the second reads the kept text
    assert engine.merger.calls_by_size[1] == ones + 2 and engine.recent_runs[-1]["images_per_device"] == 1
    started = threading.Event()
    first = _in_thread(
        lambda: engine.generate(engine.request("a lighthouse at dusk", seed=1), on_step=_while_busy(engine, started, 2))
    )
    assert started.wait(PATIENCE_S)
    pair = [_in_thread(lambda seed=seed: generate(engine, prompt, seed=seed)) for seed in (3, 4)]
    for thread, _ in (first, *pair):
        thread.join(PATIENCE_S)
    assert engine.recent_runs[-1]["images_per_device"] == 2
    for (_, outcome), seed in zip(pair, (3, 4), strict=True):
        _within_one_level(_pixels(outcome["value"]), alone[seed])
    assert engine.compile_count == compiles


def test_requests_share_a_call_when_they_make_as_many_unet_calls(merging_engine):
    """The sampler, schedule and steps are each image's own rows; what must agree is the number of UNet calls (a
    row each) and what fixes the programs and weights."""
    engine = merging_engine

    def key(**fields):
        return engine.plan(engine.request("a lighthouse", **fields)).merge_key

    euler = key(steps=4)
    assert key(steps=4, sampler="DPM++ 2M SDE", schedule_type="Karras", guidance_scale=9, seed=3) == euler
    assert key(steps=2, sampler="Heun") == key(steps=3)  # Heun: two calls a step but the last: 3 rows
    for other in (dict(steps=5), dict(steps=4, clip_skip=2), dict(steps=4, sampler="Heun")):
        assert key(**other) != euler, other


def test_stop_ends_one_request_of_a_merged_call_and_the_other_finishes(merging_engine, batched_engine):
    engine = merging_engine
    (prompt, fields), (other_prompt, other_fields) = REQUESTS[0], REQUESTS[1]
    other_fields = {**other_fields, "steps": 4}  # the merged pair's steps: with 2, the Stop would come after the last
    full = _pixels(generate(batched_engine, other_prompt, **other_fields))[:2]  # a call of N
    started, stop = threading.Event(), threading.Event()
    steps_seen: list[int] = []

    def stopping_at_1(done, total):  # Stop pressed once the first step is shown (the second is under way)
        steps_seen.append(done)
        stop.set()

    first = _in_thread(
        lambda: engine.generate(engine.request(prompt, **fields), on_step=_while_busy(engine, started, 2))
    )
    assert started.wait(PATIENCE_S)
    stopped = _in_thread(
        lambda: engine.generate(engine.request(prompt, seed=5, steps=4), on_step=stopping_at_1, should_stop=stop.is_set)
    )
    finished = _in_thread(lambda: generate(engine, other_prompt, **other_fields))
    for thread, _ in (first, stopped, finished):
        thread.join(PATIENCE_S)
    assert isinstance(stopped[1].get("error"), Stopped) and stopped[1]["error"].done == 2 and steps_seen == [1]
    np.testing.assert_array_equal(_pixels(finished[1]["value"]), full)
    assert engine.recent_runs[-1]["requests"] == 2 and not engine.recent_runs[-1]["stopped"]


def test_pictures_share_a_call_each_with_its_own_picture_mask_and_strength(merging_engine, batched_engine):
    """Image to image and inpainting requests that run as many rows merge (each block its own picture, mask, start
    weight and sigma): in a call of two each gets the first images of the engine without merging bit for bit; alone
    (a call of one image per device) within 1 level of them. They never share a call with text to image."""
    engine = merging_engine
    fields = [{**f, "steps": 4} for _, f in PICTURES]
    full = [_pixels(generate(batched_engine, prompt, **f))[:2] for (prompt, _), f in zip(PICTURES, fields, strict=True)]
    for (prompt, _), f, expected in zip(PICTURES, fields, full, strict=True):
        _within_one_level(_pixels(generate(engine, prompt, **f)), expected)
        assert engine.recent_runs[-1]["images_per_device"] == 1
    compiles, started = engine.compile_count, threading.Event()
    first = _in_thread(
        lambda: engine.generate(
            engine.request("a lighthouse at dusk", seed=1, steps=4), on_step=_while_busy(engine, started, 3)
        )
    )
    assert started.wait(PATIENCE_S)
    text = _in_thread(lambda: generate(engine, "a bowl of lemons", seed=5, steps=2))  # their 2 rows, no picture
    assert engine.merger.wait_for_waiting(1, PATIENCE_S)
    pictures = []
    for (prompt, _), f in zip(PICTURES, fields, strict=True):
        pictures.append(_in_thread(lambda p=prompt, f=f: generate(engine, p, **f)))
        assert engine.merger.wait_for_waiting(1 + len(pictures), PATIENCE_S)
    for thread, _ in (first, text, *pictures):
        thread.join(PATIENCE_S)
    runs = [(run["requests"], run["images_per_device"]) for run in list(engine.recent_runs)[-3:]]
    assert runs == [(1, 1), (1, 1), (2, 2)]  # the first; the text alone, oldest; then the two pictures together
    for (_, outcome), expected in zip(pictures, full, strict=True):
        np.testing.assert_array_equal(_pixels(outcome["value"]), expected)
    assert "value" in text[1] and engine.compile_count == compiles


def test_a_request_that_cannot_share_runs_alone_with_one_image_per_device(merging_engine):
    """The hires fix (its second pass at another size), ControlNets and the refiner's rows run alone: their own
    call of N, its first images."""
    calls = merging_engine.merger.calls
    result = generate(merging_engine, "a red fox", seed=31, hires_scale=1.5, hires_upscaler="Latent")
    assert merging_engine.merger.calls == calls  # the hires fix: not through the merger
    assert result.seeds == [31, 32] and [image.size for image in result.images] == [(96, 96)] * 2


def test_merging_needs_two_images_per_device_and_one_process():
    with pytest.raises(InvalidInput, match="--merge-requests needs --images-per-device 2 or more"):
        EngineConfig(model="tiny", merge_requests=True)
    assert EngineConfig(model="tiny", merge_requests=True, per_device_batch=4).merge_requests
    config = parse_args(["--model", "tiny", "--images-per-device", "3", "--merge-requests"]).config
    assert config.merge_requests and config.per_device_batch == 3
    assert not parse_args(["--model", "tiny"]).config.merge_requests
    # The call sizes compiled: N and the powers of two below it; --merge-full-calls: N alone.
    sizes = {n: EngineConfig(model="tiny", merge_requests=True, per_device_batch=n).merge_call_sizes for n in (2, 3, 8)}
    assert sizes == {2: (1, 2), 3: (1, 2, 3), 8: (1, 2, 4, 8)}
    full = parse_args(["--model", "tiny", "--images-per-device", "8", "--merge-requests", "--merge-full-calls"]).config
    assert full.merge_full_calls and full.merge_call_sizes == (8,)
    assert EngineConfig(model="tiny", per_device_batch=8).merge_call_sizes == (8,)
    with pytest.raises(InvalidInput, match="--merge-full-calls sets the size of --merge-requests' calls"):
        EngineConfig(model="tiny", per_device_batch=2, merge_full_calls=True)


def test_with_full_calls_a_lone_request_fills_a_call_of_n_and_gets_its_pixels_bit_for_bit(tiny_dir, batched_engine):
    """--merge-full-calls: only N's programs; a request alone runs a call of N images per device (its free blocks
    padded), so its pixels are those of the call without merging, bit for bit, however many share its call."""
    from pipeline.generator import Generator

    engine = Generator.from_pretrained(
        str(tiny_dir),
        devices=jax.devices()[:BATCHED_DEVICES],
        merge_requests=True,
        merge_full_calls=True,
        **BATCHED_SETTINGS,
    )
    engine.warmup()
    assert list(engine.call_programs) == [2]
    prompt, fields = REQUESTS[1]
    result = generate(engine, prompt, **fields)
    assert (engine.recent_runs[-1]["requests"], engine.recent_runs[-1]["images_per_device"]) == (1, 2)
    np.testing.assert_array_equal(_pixels(result), _pixels(generate(batched_engine, prompt, **fields))[:2])


def test_an_engine_service_takes_the_requests_its_merged_calls_share(merging_engine, batched_engine):
    """`python -m pipeline serve` around a merging engine (in this process) and a page's client of it: the info says
    4 requests at once, the page's pool sends 3 while the devices are held, and the two that waited share a call."""
    from pipeline.contract.request import parse_request

    engine = merging_engine
    # the first runs alone (a call of one image per device), the others in a call of N
    expected = [_pixels(generate(engine, REQUESTS[0][0], **REQUESTS[0][1]))]
    expected += [_pixels(generate(batched_engine, prompt, **fields))[:2] for prompt, fields in REQUESTS[1:]]
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
        for (_, outcome), (_, fields), pixels in zip(sent, REQUESTS, expected, strict=True):
            result = outcome["value"]
            assert result.seeds == [fields["seed"], fields["seed"] + 1]
            np.testing.assert_array_equal(
                np.stack([np.asarray(image.convert("RGB")) for image in result.images]), pixels
            )
