"""The refiner together with the hires fix and with the speed levers, on one engine (conftest's `refiner_hires_engine`:
tiny-pt + the tiny refiner on 2 devices at 64x64, 4 steps, the levers compiled, hires scale 2; one text window, no
previews):

- with the hires fix the refiner runs in the second pass only (A1111's default, "Hires fix: which pass to enable
  refiner for": second pass), its rows split at `refiner_switch` as a first pass's are;
- `cfg_end` reaches the refiner's rows (after guidance ends they run its guidance-free step, which equals its CFG
  step at scale 1), and DeepCache leaves them whole (it caches the base's UNet only).

Nothing but the engine's served programs compiles per request (it compiles them on first use: conftest's
`served_programs_only`). The refiner's parity with diffusers is tests/engine/test_refiner.py's.
"""

from __future__ import annotations

import numpy as np
from conftest import TEST_SIZE, served_programs_only

from bench.cpu.program_times import ProgramTimer
from web.page.png_info import parse_infotext

SMALL, BIG = f"{TEST_SIZE}x{TEST_SIZE}", f"{2 * TEST_SIZE}x{2 * TEST_SIZE}"


def run(engine, **fields):
    """(the result, the labels of the programs it ran) of one request, asserting it compiled only served programs.
    Followed step by step (a progress listener), so each step is a call and the labels say which program each ran."""
    with served_programs_only(engine), ProgramTimer(engine.programs) as timer:
        request = engine.request("a lighthouse", seed=4, steps=4, sampler="Euler", **fields)
        result = engine.generate(request, on_step=lambda done, total: None)
    return result, timer.labels


def pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image, np.int16) for image in result.images])


def test_the_refiner_runs_in_the_hires_pass_only(refiner_hires_engine):
    hires = {"hires_scale": 2.0, "hires_steps": 4, "hires_denoise": 0.55, "hires_upscaler": "Latent"}
    result, ran = run(refiner_hires_engine, refiner_switch=0.8, **hires)
    assert result.images[0].size == (2 * TEST_SIZE, 2 * TEST_SIZE)
    first = ran[: ran.index(f"start {BIG}")]  # the first pass (and the upscale)
    assert not [label for label in first if label.startswith("refiner_step")]  # the first pass: the base alone
    assert [label.split()[0] for label in first].count("step_full") == 4
    second = ran[ran.index(f"start {BIG}") :]
    kinds = [label.split()[0] for label in second if "step" in label.split()[0]]
    refined = kinds.count("refiner_step")
    assert 0 < refined < 4 and kinds == ["step_full"] * (4 - refined) + ["refiner_step"] * refined, second
    assert all(f"refiner_step {BIG}" in label for label in second if label.startswith("refiner_step"))
    written = parse_infotext(result.parameters[0]).settings
    assert (written["Refiner"], written["Refiner switch at"], written["Hires upscale"]) == ("tiny-refiner", "0.8", "2")
    assert "Hires refiner" not in written  # A1111 writes it only for a pass other than its default
    plain, _ = run(refiner_hires_engine, **hires)  # no refiner: the second pass on the base alone
    assert "Refiner" not in parse_infotext(plain.parameters[0]).settings
    assert np.abs(pixels(result) - pixels(plain)).max() > 8  # the refiner changed the upscaled picture


def test_cfg_end_reaches_the_refiners_rows_and_its_guidance_free_step_is_its_cfg_step_at_scale_1(
    refiner_hires_engine, refiner_engine
):
    _, ran = run(refiner_hires_engine, refiner_switch=0.5, cfg_end=0.5, guidance_scale=5.0)
    steps = [label for label in ran if "step" in label.split()[0]]
    assert steps == [f"step_full {SMALL} cfg"] * 2 + [f"refiner_step {SMALL} no-cfg"] * 2, steps
    # Guidance off from the first step: the levers engine's guidance-free refiner step (on the text's conditional
    # half) against the engine without levers, whose CFG step at scale 1 is the conditional prediction.
    free, ran = run(refiner_hires_engine, refiner_switch=0.5, guidance_scale=1.0)
    assert f"refiner_step {SMALL} no-cfg" in ran and f"refiner_step {SMALL} cfg" not in ran
    at_one, _ = run(refiner_engine, refiner_switch=0.5, guidance_scale=1.0)
    assert np.abs(pixels(free) - pixels(at_one)).max() <= 1
    guided, _ = run(refiner_hires_engine, refiner_switch=0.5, guidance_scale=5.0)  # levers at their defaults
    assert np.abs(pixels(guided) - pixels(run(refiner_engine, refiner_switch=0.5, guidance_scale=5.0)[0])).max() <= 1


def test_deepcache_leaves_the_refiners_rows_whole(refiner_hires_engine):
    cached, ran = run(refiner_hires_engine, refiner_switch=0.3, deepcache=2)
    kinds = [label.split()[0] for label in ran if "step" in label.split()[0]]
    assert kinds == ["step_full"] + ["refiner_step"] * 3, kinds  # switch 0.3: the base's first step, then the refiner
    whole, _ = run(refiner_hires_engine, refiner_switch=0.3)
    assert np.array_equal(pixels(cached), pixels(whole))  # no shallow step: the same picture
    assert parse_infotext(cached.parameters[0]).settings["Refiner"] == "tiny-refiner"
    _, ran = run(refiner_hires_engine, refiner_switch=0.6, deepcache=2)  # the base's two steps: whole, then shallow
    kinds = [label.split()[0] for label in ran if "step" in label.split()[0]]
    assert kinds[:2] == ["step_full", "step_shallow"] and set(kinds[2:]) == {"refiner_step"}, kinds
