"""Samplers (pipeline/host/planning/sampler_plan.py, pipeline/device/sampler_update.py): schedules and steps equal
diffusers' PyTorch schedulers, and images through the served step program's body equal PyTorch's pipeline, guidance as
diffusers means it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import FIXTURES

from bench.cpu.fused import ancestral_step, euler_step
from pipeline.contract.errors import InvalidInput
from pipeline.contract.sampler_names import SAMPLER_NAMES
from pipeline.device.sampler_update import scale_model_input
from pipeline.host.planning.sampler_plan import COEFFICIENTS, SamplerConfig, trailing_timesteps

PYTORCH = json.loads((FIXTURES / "sampler_schedules.json").read_text())


def _config(case) -> SamplerConfig:
    return SamplerConfig.from_scheduler_config(
        {**PYTORCH["config"], "_class_name": "EulerDiscreteScheduler"},
        sampler=case["sampler"],
        timestep_spacing=case.get("timestep_spacing", "trailing"),
        prediction_type=case["prediction_type"],
        steps_offset=case.get("steps_offset", 1),
    )


@pytest.mark.parametrize(
    "case",
    [c for c in PYTORCH["schedules"] if not c["sampler"].startswith("dpmpp")],
    ids=lambda c: f"{c['sampler']}-{c['timestep_spacing']}-{c['prediction_type']}-{c['steps']}-{c['steps_offset']}",
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
    with pytest.raises(InvalidInput, match="Unknown sampler 'dpm'; choose one of: Euler, Euler a, DPM"):
        SamplerConfig.from_scheduler_config(sdxl, sampler="dpm")
    dpm = {**sdxl, "_class_name": "DPMSolverMultistepScheduler", "use_karras_sigmas": True}
    assert SamplerConfig.from_scheduler_config(dpm).sampler == "dpmpp_2m_karras"
    with pytest.raises(InvalidInput, match="Unsupported timestep spacing"):
        SamplerConfig(timestep_spacing="karras")


# ---- DPM++ 2M (Karras): schedules and whole runs against diffusers' PyTorch DPMSolverMultistepScheduler -----------

DPM_SCHEDULES = [c for c in PYTORCH["schedules"] if c["sampler"].startswith("dpmpp")]


@pytest.mark.parametrize("case", DPM_SCHEDULES, ids=lambda c: f"{c['sampler']}-{c['timestep_spacing']}-{c['steps']}")
def test_dpm_schedule_equals_pytorch_scheduler(case):
    config = SamplerConfig.from_scheduler_config(PYTORCH["config"], timestep_spacing=case["timestep_spacing"])
    plan = config.plan(case["steps"], case["sampler"])
    assert plan.timesteps.tolist() == case["timesteps"]
    np.testing.assert_allclose(plan.sigmas, case["sigmas"], rtol=1e-5, atol=1e-6)
    assert plan.coefficients.shape == (case["steps"], len(COEFFICIENTS))


@pytest.mark.parametrize(
    "case", PYTORCH["dpm_runs"], ids=lambda c: f"{c['sampler']}-{c['prediction_type']}-{c['steps']}"
)
def test_dpm_run_equals_pytorch_scheduler(case):
    """Every step of a run with a linear stand-in for the UNet: the multistep history (D_prev) is PyTorch's."""
    from pipeline.device.sampler_update import sampler_update

    config = SamplerConfig.from_scheduler_config(PYTORCH["config"], prediction_type=case["prediction_type"])
    plan = config.plan(case["steps"], case["sampler"])
    x = np.asarray(case["start"], np.float32) * plan.init_sigma
    previous = x
    for row in plan.coefficients:
        model_input = x / np.sqrt(row[1] ** 2 + 1)  # what the UNet sees: DPM-Solver's own sample
        output = case["weight"] * model_input + 0.01 * row[0] / 1000
        x, previous = sampler_update(case["prediction_type"], output, x, row, previous, np.zeros_like(x))
    np.testing.assert_allclose(x, case["final"], rtol=1e-4, atol=1e-5)


def test_plans_for_every_sampler_and_step_count():
    config = SamplerConfig()
    for name, ident in list(SAMPLER_NAMES.items())[:4]:  # the others: tests/engine/test_a1111_samplers.py
        for steps in (1, 2, 50, 100):
            plan = config.plan(steps, name)
            assert plan.sampler == ident and plan.coefficients.shape == (steps, len(COEFFICIENTS))
            assert plan.label == name
            assert np.isfinite(plan.coefficients).all()
            adds_noise = (plan.coefficients[:, 5] != 0).any()  # only Euler a does, before its final step
            assert adds_noise == (ident == "euler_ancestral" and steps > 1)
            assert plan.coefficients[0, 4] == 0  # the first step has no previous prediction
    assert config.plan(4, "dpm++ 2m karras").sampler == "dpmpp_2m_karras"  # A1111's names, any case
    with pytest.raises(InvalidInput, match="Unknown sampler 'DPM2'"):
        config.plan(4, "DPM2")
    with pytest.raises(InvalidInput, match="Steps must be between 1 and 1000; got 0"):
        config.plan(0, "Euler")


def test_trailing_spacing_runs_the_steps_asked_for_every_count():
    """ "trailing" timesteps are diffusers' np.arange ones, rounding included; where that arange lets in one more
    timestep (-1: 61, 103, 121, 122 of 1000), the plan still has the steps asked, never a step outside training."""
    config = SamplerConfig(timestep_spacing="trailing")
    longer = []
    for steps in range(1, 1001):
        ours = trailing_timesteps(1000, steps)
        theirs = np.arange(1000, 0, -1000 / steps).round().astype(np.int64) - 1  # diffusers' set_timesteps
        np.testing.assert_array_equal(ours, theirs[:steps])
        if len(theirs) > steps:
            longer.append(steps)
            assert theirs[-1] == -1
        assert ours.min() >= 0 and ours.max() == 999
    assert longer[:4] == [61, 103, 121, 122]
    for name in [n for n in SAMPLER_NAMES if n not in ("Heun", "LCM")]:  # Heun: 2 rows a step; LCM: <= 50 steps
        for steps in longer[:4]:
            assert config.plan(steps, name).coefficients.shape == (steps, len(COEFFICIENTS))


# ---- images against diffusers' PyTorch pipeline (tests/fixtures/tiny-pt, shared with the checkpoint loader) ------


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


def test_trailing_and_guidance_0_and_1_equal_pytorch_pipeline(tiny_pt):
    """PyTorch's trailing, guidance-0 images: the guidance-free program, and the CFG program at g = 0 and g = 1."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.host.planning.tokens import tokenize

    manifest = json.loads((FIXTURES / "tiny-pt-expected.json").read_text())
    arrays = np.load(FIXTURES / "tiny-pt-expected.npz")
    cases = [c for c in manifest["cases"] if c["timestep_spacing"] == "trailing"]
    assert sorted(c["steps"] for c in cases) == [2, 4] and {c["guidance_scale"] for c in cases} == {0.0}
    modules = Modules.of(tiny_pt.networks)
    tokenizers = (tiny_pt.networks.tokenizer, tiny_pt.networks.tokenizer_2)
    trailing = SamplerConfig.from_scheduler_config(manifest["scheduler"], timestep_spacing="trailing")
    assert trailing.steps_offset == 1 and trailing.sampler == "euler"

    def run(sampler, steps, prompt, negative, has_negative, guidance):  # -> uint8 [b, 64, 64, 3] as int
        b = len(guidance)
        ids = np.stack([tokenize(tokenizers, prompt)[0]] * b)  # [b, 2, 77]
        negative_ids = np.stack([tokenize(tokenizers, negative)[0]] * b)  # [b, 2, 77]
        latents = np.repeat(arrays["latents"], b, axis=0)  # [b, 4, 8, 8]
        flags, scales = np.array(has_negative), np.array(guidance, np.float32)  # [b], [b]
        return run_local(
            modules, tiny_pt.params, ids, negative_ids, flags, scales, latents, sampler.plan(steps), cfg=sampler.cfg
        ).astype(np.int16)

    def assert_matches(got, expected, what):
        assert np.abs(got - expected).max() <= 1, what
        assert np.mean(got != expected) < 0.02, what

    for case in cases:
        expected = np.round(arrays[case["name"]][0] * 255)  # [64, 64, 3]
        assert trailing.schedule(case["steps"]).timesteps.tolist() == case["timesteps"]
        no_cfg = dataclasses.replace(trailing, cfg=False)
        assert_matches(run(no_cfg, case["steps"], case["prompt"], "", [False], [0.0])[0], expected, case["name"])
    # With CFG compiled in, g <= 1 is the conditional prediction alone (a negative prompt changes nothing).
    case = next(c for c in cases if c["steps"] == 2)
    images = run(trailing, 2, case["prompt"], "blurry, dark", [True] * 3, [0.0, 1.0, 5.0])
    expected = np.round(arrays[case["name"]][0] * 255)
    assert_matches(images[0], expected, "guidance 0")
    assert np.array_equal(images[0], images[1])  # guidance 1: the same program path, bit for bit
    assert np.mean(images[2] != expected) > 0.5  # guidance 5 still guides


@pytest.mark.parametrize("name", ["dpmpp_2m_karras_cfg_8_steps", "dpmpp_2m_cfg_8_steps"])
def test_dpm_images_equal_pytorch_pipeline(tiny_pt, name):
    """DPM++ 2M (Karras), 8 steps with CFG, through the served step program's body: within 1 level of PyTorch's."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.host.planning.tokens import tokenize

    manifest = json.loads((FIXTURES / "tiny-pt-expected.json").read_text())
    case = next(c for c in manifest["cases"] if c["name"] == name)
    expected = np.round(np.load(FIXTURES / "tiny-pt-expected.npz")[name][0] * 255)  # [64, 64, 3]
    latents = np.load(FIXTURES / "tiny-pt-expected.npz")["latents"]  # [1, 4, 8, 8]
    config = SamplerConfig.from_scheduler_config(manifest["scheduler"])
    plan = config.plan(case["steps"], case["sampler"])
    assert plan.timesteps.tolist() == case["timesteps"]
    tokenizers = (tiny_pt.networks.tokenizer, tiny_pt.networks.tokenizer_2)
    negative = case["negative_prompt"]
    image = run_local(
        Modules.of(tiny_pt.networks),
        tiny_pt.params,
        tokenize(tokenizers, case["prompt"])[0][None],
        tokenize(tokenizers, negative or "")[0][None],
        np.array([negative is not None]),
        np.array([case["guidance_scale"]], np.float32),
        latents,
        plan,
    )[0].astype(np.int16)
    assert np.abs(image - expected).max() <= 1, name
    assert np.mean(image != expected) < 0.02, name
