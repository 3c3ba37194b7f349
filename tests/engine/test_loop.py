"""The host loop (pipeline/host/loop.py) through the generator: one progress report per step, in order, per call (a
request nobody follows runs several steps a call); every offered size served by its own compiled programs, none with
a host callback, a bad size refused."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from conftest import UI_SIZES, UI_STEPS, generate

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput


def test_progress_fires_once_per_step_in_order(ui_engine):
    before = ui_engine.compile_count
    for size in UI_SIZES:
        seen: list[tuple[int, int]] = []
        request = ui_engine.request("a red apple", seed=1, size=size)
        result = ui_engine.generate(request, on_step=lambda k, n, seen=seen: seen.append((k, n)))
        assert seen == [(k, UI_STEPS) for k in range(1, UI_STEPS + 1)]  # 8 devices call back; reported once
        assert result.images[0].size == (size[1], size[0])  # PIL: (width, height)
        assert f"Size: {size[1]}x{size[0]}" in result.parameters[0]
    assert ui_engine.compile_count == before


def test_progress_calls_do_not_cross(ui_engine):
    """Two threads share one generator: each listener sees exactly its own call's steps."""
    seen: dict[int, list[int]] = {0: [], 1: []}

    def run(i):
        ui_engine.generate(ui_engine.request(f"prompt {i}", seed=i), on_step=lambda k, n: seen[i].append(k))

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {0: list(range(1, UI_STEPS + 1)), 1: list(range(1, UI_STEPS + 1))}


def test_sizes_give_their_own_pixels_and_bad_size_is_refused(ui_engine):
    square = generate(ui_engine, "a lighthouse", seed=3, size=UI_SIZES[0])
    default = generate(ui_engine, "a lighthouse", seed=3)
    np.testing.assert_array_equal(np.asarray(square.images[0]), np.asarray(default.images[0]))
    before = ui_engine.compile_count
    with pytest.raises(InvalidInput, match="compiled"):
        generate(ui_engine, "a lighthouse", seed=3, size=(128, 128))
    assert ui_engine.compile_count == before
    assert ui_engine.sizes == UI_SIZES


def test_no_served_program_has_a_host_callback(engine, ui_engine):
    """Progress is reported by the host between steps: every program can go to the persistent compilation cache.
    `engine` serves every kind of program (levers, texts of 1 and 3 windows, previews), `ui_engine` two sizes. Each
    program is lowered once: `ui_engine`'s 64x64 ones are `engine`'s (the same devices and settings but its windows),
    so of `ui_engine` the 224x128 ones."""
    steps = ["step_full {s} cfg", "step_shallow {s} cfg", "step_full {s} no-cfg", "step_shallow {s} no-cfg"]

    def sized(windows: bool) -> list[str]:
        # per size: the picture's encoder, the start, the steps of cfg_end and deepcache (a text of 1 window and,
        # with `windows`, of 3), the previews, the decoder
        texts = [*steps, *[f"{step} 3 windows" for step in steps]] if windows else steps
        return ["encode_image {s}", "start {s}", *texts, "halve_feature {s}", "preview {s}", "decode {s}"]

    # the texts' programs: the encoders, the cross-attention tables (--cross-attention-cache: on CPU devices, the
    # default) with guidance and without, the conditional half
    tables = ["cross_kv cfg", "cross_kv no-cfg"]
    texts = ["encode cfg", "encode cfg 3 windows", *tables, *[f"{table} 3 windows" for table in tables]]
    texts += ["halve_text", "halve_text 3 windows"]
    assert [key.label for key in engine.program_keys()] == texts + [label.format(s="64x64") for label in sized(True)]
    labels = [label.format(s=size) for size in ("64x64", "224x128") for label in sized(False)]
    assert [key.label for key in ui_engine.program_keys()] == ["encode cfg", *tables, "halve_text"] + labels
    lowered = {key.label: engine.programs.lower(key) for key in engine.program_keys()}
    lowered |= {
        key.label: ui_engine.programs.lower(key) for key in ui_engine.program_keys() if key.label not in lowered
    }
    assert len(lowered) == len(engine.program_keys()) + len(sized(False))  # every program of both, once
    for label, program in lowered.items():
        text = program.as_text()
        assert "callback" not in text and "host_callback" not in text, label
    # Progress is the page's (build_page(progress=...)), not the engine's: no engine setting can add a callback.
    assert "progress" not in {field.name for field in dataclasses.fields(EngineConfig)}


def test_a_request_nobody_follows_runs_several_steps_a_call_with_the_same_pixels(batched_engine, monkeypatch):
    """Without progress, previews or Stop a call runs up to `steps_per_call` (4 on `batched_engine`) consecutive steps
    of one program (device/step_block.py), with them one step a call; the pixels are the same bit for bit, and nothing
    compiles: 6 steps are calls of 4 and 2, guided or not."""
    from pipeline.host.compiling.programs import STEP_KINDS

    engine, calls = batched_engine, []
    compile_program = engine.programs.compile

    def counting(key):
        program = compile_program(key)
        if key.kind not in STEP_KINDS:
            return program
        return lambda *args: calls.append(int(args[-1])) or program(*args)  # its last argument: the rows it runs

    monkeypatch.setattr(engine.programs, "compile", counting)
    before = engine.compile_count
    for guidance in (5.0, 1.0):
        request = engine.request("a lighthouse at dusk", seed=7, steps=6, guidance_scale=guidance)
        calls.clear()
        alone = engine.generate(request)
        assert calls == [4, 2]
        calls.clear()
        followed = engine.generate(request, on_step=lambda done, total: None)
        assert calls == [1] * 6
        for a, b in zip(alone.images, followed.images, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert engine.compile_count == before


def test_step_calls_join_consecutive_rows_of_one_program_up_to_the_most():
    """The loop's grouping (host/loop.step_calls): rows join while their program is the same, up to the most; a row
    that needs host work first (the text's conditional half once guidance ends, or the feature's) starts a call."""
    from pipeline.host.loop import step_calls
    from pipeline.host.planning.speed_plan import PlannedStep

    def row(index, cfg=True, full=True, drop=False, halve=False):
        return PlannedStep(index=index, cfg=cfg, full=full, drop_uncond=drop, halve_feature=halve)

    def program_of(planned):
        return (planned.full, planned.cfg)

    schedule = (
        row(0),
        row(1),
        row(2, full=False),
        row(3, full=False),
        row(4),
        row(5, cfg=False, drop=True),
        row(6, cfg=False),
    )
    calls = step_calls(schedule, 0, 4, program_of)
    assert [(start, [r.index for r in rows]) for start, rows in calls] == [
        (0, [0, 1]),
        (2, [2, 3]),
        (4, [4]),
        (5, [5, 6]),
    ]
    plain = tuple(row(i) for i in range(10))
    assert [len(rows) for _, rows in step_calls(plain, 3, 4, program_of)] == [4, 4, 2]
    assert [start for start, _ in step_calls(plain, 3, 4, program_of)] == [3, 7, 11]  # positions after `before`
    assert [len(rows) for _, rows in step_calls(plain, 0, 1, program_of)] == [1] * 10
    halved = (row(0), row(1, full=False, halve=True), row(2, full=False))
    assert [len(rows) for _, rows in step_calls(halved, 0, 4, program_of)] == [1, 2]
