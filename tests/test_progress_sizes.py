"""Engine side of live progress and aspect ratios: one report per step from the host loop, sizes never compile."""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from conftest import UI_SIZES, UI_STEPS

from pipeline.errors import InvalidInput
from pipeline.fields import check_size
from pipeline.sizes import default_sizes, parse_sizes
from web.sizes import ratio_name, size_label


def test_progress_fires_once_per_step_in_order(ui_engine):
    before = ui_engine.compile_count
    for size in UI_SIZES:
        seen: list[tuple[int, int]] = []
        result = ui_engine.generate(
            "a red apple", seed=1, size=size, progress=lambda k, n, seen=seen: seen.append((k, n))
        )
        assert seen == [(k, UI_STEPS) for k in range(1, UI_STEPS + 1)]  # 8 devices call back; reported once
        assert result.images[0].size == (size[1], size[0])  # PIL: (width, height)
        assert f"Size: {size[1]}x{size[0]}" in result.parameters[0]
    assert ui_engine.compile_count == before


def test_progress_calls_do_not_cross(ui_engine):
    """Two threads share one generator: each listener sees exactly its own call's steps."""
    seen: dict[int, list[int]] = {0: [], 1: []}

    def run(i):
        ui_engine.generate(f"prompt {i}", seed=i, progress=lambda k, n: seen[i].append(k))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {0: list(range(1, UI_STEPS + 1)), 1: list(range(1, UI_STEPS + 1))}


def test_sizes_give_their_own_pixels_and_bad_size_is_refused(ui_engine):
    square = ui_engine.generate("a lighthouse", seed=3, size=UI_SIZES[0])
    default = ui_engine.generate("a lighthouse", seed=3)
    np.testing.assert_array_equal(np.asarray(square.images[0]), np.asarray(default.images[0]))
    before = ui_engine.compile_count
    with pytest.raises(InvalidInput, match="compiled"):
        ui_engine.generate("a lighthouse", seed=3, size=(128, 128))
    assert ui_engine.compile_count == before
    assert ui_engine.sizes == UI_SIZES


def test_no_served_program_has_a_host_callback(ui_engine):
    """Progress is reported by the host between steps: every program can go to the persistent compilation cache."""
    keys = ui_engine.program_keys()
    assert [key.label for key in keys] == [
        "encode cfg", "start 64x64", "step 64x64 cfg", "decode 64x64", "start 224x128", "step 224x128 cfg",
        "decode 224x128",
    ]  # fmt: skip
    for key in keys:
        text = ui_engine.programs.lower(key).as_text()
        assert "callback" not in text and "host_callback" not in text, key.label
    assert ui_engine.config.progress is True


def test_size_parsing_and_labels():
    assert parse_sizes("1024x1024, 1344×768") == [(1024, 1024), (768, 1344)]
    for bad in ("1024", "1001x1000", "0x8", "axb", "136x136"):  # 136: a multiple of 8, not of 32
        with pytest.raises(InvalidInput):
            parse_sizes(bad)
    labels = [size_label(h, w) for h, w in default_sizes()]
    assert labels == ["1024×1024 (1:1)", "1344×768 (16:9)", "768×1344 (9:16)"]
    every = [size_label(h, w) for h, w in parse_sizes("sdxl")]
    assert len(every) == 9 and every[0] == "1024×1024 (1:1)" and "640×1536 (9:21)" in every
    for every in (False, True):
        tiny, full = default_sizes(tiny=True, every=every), default_sizes(every=every)
        if not every:  # the default offer's ratios survive the scaling; 21:9 at 128 px is 320×128, labelled 5:2
            assert [ratio_name(h, w) for h, w in tiny] == [ratio_name(h, w) for h, w in full]
        for h, w in tiny + full:  # every label names a true ratio (issue 20: 160×96 was called 16:9)
            a, b = (int(n) for n in ratio_name(h, w).split(":"))
            assert abs(w / h - a / b) / (a / b) < 0.03, (w, h, a, b)
        assert all(h % 32 == 0 and w % 32 == 0 and min(h, w) == 128 for h, w in tiny)
    assert parse_sizes("SDXL", tiny=True) == default_sizes(tiny=True, every=True)
    sizes = [(64, 64), (128, 224)]
    assert check_size("224×128 (16:9)", sizes) == check_size("224x128", sizes) == (128, 224)
    assert check_size(None, sizes) == (64, 64)
    with pytest.raises(InvalidInput, match="not offered"):
        check_size("1344×768 (16:9)", sizes)
    assert jax.device_count() == 8


def test_bench_hostloop_part_measures_both_loops(engine):
    """`python -m bench --only hostloop` on the shared engine: both loops timed, no compilation while timing."""
    from bench.hostloop import host_loop_cost

    result = host_loop_cost(engine, steps=3, runs=1, say=lambda _line: None)
    assert result.host_loop_call.median > 0 and result.fused_call.median > 0
    assert result.compiles_while_timing == 0 and result.steps == 3
