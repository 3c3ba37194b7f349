"""Samplers: schedules equal diffusers' PyTorch schedulers, guidance means what diffusers means, presets apply."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.samplers import SamplerConfig, ancestral_step, euler_step, scale_model_input
from pipeline.validation import InvalidInput

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PYTORCH = json.loads((FIXTURES / "sampler_schedules.json").read_text())


def _config(case) -> SamplerConfig:
    return SamplerConfig.from_scheduler_config(
        {**PYTORCH["config"], "_class_name": "EulerDiscreteScheduler"},
        sampler=case["sampler"],
        timestep_spacing=case.get("timestep_spacing", "trailing"),
        prediction_type=case["prediction_type"],
    )


@pytest.mark.parametrize(
    "case",
    PYTORCH["schedules"],
    ids=lambda c: f"{c['sampler']}-{c['timestep_spacing']}-{c['prediction_type']}-{c['steps']}",
)
def test_schedule_equals_pytorch_scheduler(case):
    schedule = _config(case).schedule(case["steps"])
    np.testing.assert_allclose(schedule.timesteps, case["timesteps"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(schedule.sigmas, case["sigmas"], rtol=1e-5, atol=1e-5)
    assert schedule.init_noise_sigma == pytest.approx(case["init_noise_sigma"], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("case", PYTORCH["steps"], ids=lambda c: f"{c['sampler']}-{c['prediction_type']}")
def test_one_step_equals_pytorch_scheduler(case):
    import jax.numpy as jnp

    config = _config(case)
    schedule = config.schedule(case["steps"])
    i = case["index"]
    sample, output, noise = (jnp.asarray(case[k], jnp.float32) for k in ("sample", "model_output", "noise"))
    sigma = jnp.float32(schedule.sigmas[i])
    np.testing.assert_allclose(scale_model_input(sample, sigma), case["scaled_input"], rtol=1e-5, atol=1e-5)
    if config.sampler == "euler":
        got = euler_step(config, output, sample, sigma, schedule.sigmas[i + 1])
    else:
        got = ancestral_step(config, output, sample, sigma, schedule.sigmas_up[i], schedule.sigmas_down[i], noise)
    np.testing.assert_allclose(got, case["prev_sample"], rtol=1e-5, atol=1e-5)


def test_scheduler_config_is_read_whole_and_refuses_what_it_cannot_honour():
    sdxl = {**PYTORCH["config"], "_class_name": "EulerDiscreteScheduler"}
    config = SamplerConfig.from_scheduler_config(sdxl)
    assert (config.sampler, config.timestep_spacing, config.steps_offset, config.cfg) == ("euler", "leading", 1, True)
    turbo = {**sdxl, "_class_name": "EulerAncestralDiscreteScheduler", "timestep_spacing": "trailing"}
    assert SamplerConfig.from_scheduler_config(turbo).sampler == "euler_ancestral"
    # PyTorch's default steps_offset is 0; a Flax-written config (no such key) was made with Flax's fixed +1.
    no_offset = {k: v for k, v in sdxl.items() if k != "steps_offset"}
    assert SamplerConfig.from_scheduler_config(no_offset).steps_offset == 0
    assert (
        SamplerConfig.from_scheduler_config({**no_offset, "_class_name": "FlaxEulerDiscreteScheduler"}).steps_offset
        == 1
    )
    assert SamplerConfig.from_scheduler_config(sdxl, timestep_spacing="trailing", cfg=False).schedule(
        4
    ).timesteps.tolist() == [999, 749, 499, 249]
    for bad in ({"use_karras_sigmas": True}, {"interpolation_type": "log_linear"}, {"timestep_type": "continuous"}):
        with pytest.raises(InvalidInput, match=f"cannot honour.*{next(iter(bad))}") as info:
            SamplerConfig.from_scheduler_config({**sdxl, **bad})
        assert "\n" not in str(info.value)
    with pytest.raises(InvalidInput, match="Unsupported sampler 'dpm'"):
        SamplerConfig.from_scheduler_config(sdxl, sampler="dpm")
    with pytest.raises(InvalidInput, match="Unsupported timestep spacing"):
        SamplerConfig(timestep_spacing="karras")


# ---- the engine: guidance semantics, the guidance-free program, Euler-ancestral across device counts ---------------

PROMPT = "a red fox in fresh snow"


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images]).astype(np.int16)  # [B, H, W, 3]


def _close(a, b) -> bool:
    """Equal within 1 level, all but a few rounding-boundary pixels identical (the UNet batch differs)."""
    return np.abs(a - b).max() <= 1 and np.mean(a != b) < 0.01


@pytest.fixture(scope="module")
def no_cfg(tiny_dir):
    """The session engine's settings (Euler, leading) as a guidance-free program."""
    from conftest import TEST_SIZE, TEST_STEPS

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", cfg=False
    )
    generator.warmup()
    return generator


def test_guidance_up_to_1_gives_the_conditional_image(engine, no_cfg):
    expected = _pixels(no_cfg.generate(PROMPT, seed=11))
    for guidance in (0.0, 1.0):
        got = _pixels(engine.generate(PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=guidance))
        assert _close(got, expected), guidance
    guided = _pixels(engine.generate(PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=5.0))
    assert np.mean(guided != expected) > 0.5  # guidance > 1 still guides


def test_guidance_free_program_compiles_once_and_ignores_guidance(no_cfg):
    assert no_cfg.sampler.cfg is False and len(no_cfg._compiled) == 1
    before = no_cfg.compile_count
    first = no_cfg.generate(PROMPT, seed=3, guidance_scale=0.0)
    for i, guidance in enumerate((1.0, 7.5, 20.0)):
        result = no_cfg.generate(f"{PROMPT} {i}", negative_prompt="ugly" * i, seed=100 + i, guidance_scale=guidance)
        assert result.negative_prompt == "" and "CFG scale: 0," in result.parameters[0]
    again = no_cfg.generate(PROMPT, negative_prompt="anything", seed=3, guidance_scale=12.0)
    assert np.array_equal(_pixels(first), _pixels(again))  # negative prompt and guidance are ignored
    assert no_cfg.compile_count == before


def _ancestral(tiny_dir, devices):
    from conftest import TEST_SIZE, TEST_STEPS

    from pipeline.generator import Generator

    generator = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32", devices=devices,
        sampler="euler_ancestral", timestep_spacing="trailing", prediction_type="v_prediction", cfg=False,
    )  # fmt: skip
    generator.warmup()
    return generator


def test_ancestral_v_prediction_same_images_on_4_and_8_devices(tiny_dir):
    import jax

    eight = _ancestral(tiny_dir, jax.devices()[:8])
    four = _ancestral(tiny_dir, jax.devices()[:4])
    a, b = eight.generate(PROMPT, seed=42), four.generate(PROMPT, seed=42)
    assert a.seeds[:4] == b.seeds
    assert np.array_equal(_pixels(a)[:4], _pixels(b))
    assert "Sampler: Euler a, v-prediction" in a.parameters[0] and "Timestep spacing: trailing" in a.parameters[0]
    assert len({_pixels(a)[i].tobytes() for i in range(8)}) == 8 and _pixels(a).std() > 1
