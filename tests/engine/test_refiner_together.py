"""The refiner together with the hires fix and with the speed levers, on one engine (tiny-pt + the tiny refiner on 2
devices at 64x64, 4 steps, the levers compiled, hires scale 2; one text window, no previews):

- with the hires fix the refiner runs in the second pass only (A1111's default, "Hires fix: which pass to enable
  refiner for": second pass), its rows split at `refiner_switch` as a first pass's are.

Nothing compiles per request. The refiner's parity with diffusers is tests/engine/test_refiner.py's.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, TEST_SIZE, TINY_PT, TINY_REFINER

from bench.program_times import ProgramTimer
from web.png_info import parse_infotext

SMALL, BIG = f"{TEST_SIZE}x{TEST_SIZE}", f"{2 * TEST_SIZE}x{2 * TEST_SIZE}"


@pytest.fixture(scope="module")
def together():
    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(TINY_PT), height=TEST_SIZE, width=TEST_SIZE, steps=4, dtype="float32", prompt_windows=1, previews=False,
        devices=jax.devices()[:FEATURE_DEVICES], refiner=str(TINY_REFINER), hires_scales=(2.0,),
    )  # fmt: skip
    generator.warmup()
    return generator


def run(engine, **fields):
    """(the result, the labels of the programs it ran) of one request, asserting it compiled nothing."""
    before = engine.compile_count
    with ProgramTimer(engine.programs) as timer:
        result = engine.generate(engine.request("a lighthouse", seed=4, steps=4, sampler="Euler", **fields))
    assert engine.compile_count == before
    return result, timer.labels


def pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image, np.int16) for image in result.images])


def test_the_refiner_runs_in_the_hires_pass_only(together):
    hires = {"hires_scale": 2.0, "hires_steps": 4, "hires_denoise": 0.55, "hires_upscaler": "Latent"}
    result, ran = run(together, refiner_switch=0.8, **hires)
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
    plain, _ = run(together, **hires)  # no refiner: the second pass on the base alone
    assert "Refiner" not in parse_infotext(plain.parameters[0]).settings
    assert np.abs(pixels(result) - pixels(plain)).max() > 8  # the refiner changed the upscaled picture
