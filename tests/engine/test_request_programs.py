"""Which compiled programs a request runs: a plain txt2img runs the plain programs only (one 77-token window, no
preview, no picture; and the text's cross-attention table, --cross-attention-cache's default on these CPU devices), a
long prompt the N-window ones, a watched request its previews, a text met in a recent request neither the text encoder
nor the table (--text-cache); none of them compiles."""

import numpy as np
from conftest import TEST_SIZE, TEST_STEPS, generate

from bench.cpu.program_times import ProgramTimer
from pipeline.host.planning import run_plan
from pipeline.host.text_cache import TextCache

LONG_PROMPT = " ".join(f"word{i}" for i in range(100))  # 100 tokens: two windows


def programs_run(engine, call) -> list[str]:
    """The labels of the compiled programs `call()` runs on `engine`, in the order it runs them."""
    with ProgramTimer(engine.programs) as timer:
        call()
    return timer.labels


def calls_of(engine, steps: int) -> int:
    """The step calls of a request of `steps` steps of one program that nobody follows step by step."""
    return -(-steps // engine.config.steps_per_call)


def test_plain_request_runs_the_plain_txt2img_programs(engine, monkeypatch):
    size = f"{TEST_SIZE}x{TEST_SIZE}"
    monkeypatch.setattr(engine, "text_cache", TextCache())  # no text met before: each first request encodes
    before = engine.compile_count
    ran = programs_run(engine, lambda: generate(engine, "a lighthouse at dusk", negative_prompt="blurry", seed=2))
    steps = [f"step_full {size} cfg"] * calls_of(engine, TEST_STEPS)  # nobody follows: several steps a call
    assert ran == ["encode cfg", f"start {size}", "cross_kv cfg", *steps, f"decode {size}"]
    again = programs_run(engine, lambda: generate(engine, "a lighthouse at dusk", negative_prompt="blurry", seed=3))
    assert again == [f"start {size}", *steps, f"decode {size}"]  # the same texts: their outputs and table were kept
    long = programs_run(engine, lambda: generate(engine, LONG_PROMPT, seed=2))
    assert long == [
        "encode cfg 3 windows",
        f"start {size}",
        "cross_kv cfg 3 windows",
        *[f"step_full {size} cfg 3 windows"] * calls_of(engine, TEST_STEPS),
        f"decode {size}",
    ]
    # a long negative prompt needs the N-window programs as much as a long prompt
    assert programs_run(engine, lambda: generate(engine, "a cat", negative_prompt=LONG_PROMPT))[0].endswith("windows")
    watched = programs_run(
        engine, lambda: engine.generate(engine.request("a cat", steps=4), on_preview=lambda *_: None)
    )
    assert watched.count(f"preview {size}") == 1  # after step 2 of 4 (the last step's picture is the answer)
    assert engine.compile_count == before


def test_unguided_request_runs_the_guidance_free_steps(engine, monkeypatch):
    """guidance <= 1 asks for no guidance: on a CFG server the texts' conditional half is kept once, before the
    first step (with its own cross-attention table: the CFG text's is never made), and every step runs the
    guidance-free program (half the UNet rows), not the CFG one."""
    size = f"{TEST_SIZE}x{TEST_SIZE}"
    monkeypatch.setattr(engine, "text_cache", TextCache(0))
    before = engine.compile_count
    images = []
    ran = programs_run(engine, lambda: images.extend(generate(engine, "a red fox", seed=3, guidance_scale=1.0).images))
    assert ran == [
        "encode cfg",
        f"start {size}",
        "halve_text",
        "cross_kv no-cfg",
        *[f"step_full {size} no-cfg"] * calls_of(engine, TEST_STEPS),
        f"decode {size}",
    ]
    assert engine.compile_count == before


def test_short_prompt_reads_the_same_in_one_window_as_in_three(engine, monkeypatch):
    """The 3-window programs mask the empty windows out: a short prompt run through them gives the 1-window
    programs' images (to float rounding: the masked softmax sums 231 keys, the plain one 77)."""
    prompt, negative = "a windmill in a field of tulips", "blurry"
    monkeypatch.setattr(engine, "text_cache", TextCache(0))
    one = generate(engine, prompt, negative_prompt=negative, seed=5).images
    monkeypatch.setattr(run_plan, "text_windows", lambda filled, windows: windows)
    three = []
    ran = programs_run(engine, lambda: three.extend(generate(engine, prompt, negative_prompt=negative, seed=5).images))
    assert ran[0] == "encode cfg 3 windows"
    difference = np.abs(pixels(one) - pixels(three))
    assert difference.max() <= 1 and (difference > 0).mean() < 1e-3


def pixels(images) -> np.ndarray:
    return np.stack([np.asarray(image) for image in images]).astype(int)
