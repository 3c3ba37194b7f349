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
