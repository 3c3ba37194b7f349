"""A1111's samplers and schedule types (pipeline/contract/sampler_names.py, pipeline/host/planning/solvers.py):
schedules, whole runs and images equal diffusers' PyTorch schedulers and pipeline (tests/fixtures/a1111-samplers.*, made
by scripts/make_a1111_sampler_fixtures.py), a combination that makes no sense is one sentence, and no sampler, schedule
type or step count compiles anything."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import FIXTURES, generate

from pipeline.contract.errors import InvalidInput
from pipeline.contract.sampler_names import SAMPLER_NAMES, SCHEDULE_TYPES, SCHEDULES_OF, resolve
from pipeline.host.planning.image_plan import image_plan
from pipeline.host.planning.sampler_plan import HISTORY, SamplerConfig

PYTORCH = json.loads((FIXTURES / "a1111-samplers.json").read_text())
#: Samplers whose PyTorch sample is x / sqrt(sigma^2 + 1) of the engine's (variance preserving).
VARIANCE_PRESERVING = {"DPM++ 2M", "DPM++ 2M SDE", "UniPC", "DDIM", "LCM"}


def _config() -> SamplerConfig:
    return SamplerConfig.from_scheduler_config({**PYTORCH["config"], "_class_name": "EulerDiscreteScheduler"})


def _name(case) -> str:
    return f"{case['sampler']}-{case['schedule_type']}-{case['steps']}" + (
        f"-from-{case['first']}" if case.get("first") else ""
    )


@pytest.mark.parametrize("case", PYTORCH["schedules"], ids=_name)
def test_schedule_equals_pytorch_scheduler(case):
    plan = _config().plan(case["steps"], case["sampler"], case["schedule_type"])
    np.testing.assert_allclose(plan.timesteps, case["timesteps"], rtol=1e-5, atol=1e-4)
    if case["sigmas"] is not None:
        np.testing.assert_allclose(plan.sigmas, case["sigmas"], rtol=1e-5, atol=1e-5)
    init = case["init_noise_sigma"]
    if case["sampler"] in VARIANCE_PRESERVING:  # the engine's latents are PyTorch's × sqrt(sigma_0^2 + 1)
        init *= float(np.sqrt(np.float64(plan.sigmas[0]) ** 2 + 1))
    assert plan.init_sigma == pytest.approx(init, rel=1e-5)


@pytest.fixture(scope="module")
def one_step():
    """The device's update of one row (`sampler_update` + `history_update`), jitted once for every run."""
    import jax

    from pipeline.device.sampler_update import history_update, sampler_update

    def step(output, x, row, history, noise):
        updated, denoised = sampler_update("epsilon", output, x, row, history[:, 0], noise)
        return history_update(updated, x, denoised, row, history)

    return jax.jit(step)


@pytest.mark.parametrize("case", PYTORCH["runs"]["cases"], ids=_name)
def test_run_equals_pytorch_scheduler(case, one_step):
    """Every row of a run with a linear stand-in for the UNet: the history (DPM, UniPC, LMS, Heun), the noise (SDE,
    LCM) and a later first step (image to image: diffusers' `set_begin_index`) as PyTorch's."""
    steps, first, schedule = case["steps"], case["first"], case["schedule_type"]
    config = _config()
    if schedule.endswith(" clip_sample"):  # DDIM's default clipping of x0
        config, schedule = dataclasses.replace(config, clip_sample=True), schedule.removesuffix(" clip_sample")
    full = config.plan(steps, case["sampler"], schedule, first)
    plan = image_plan(full, steps - first, pure_noise=False).plan if first else full
    runs = PYTORCH["runs"]
    start, noise, weight = np.asarray(runs["start"], np.float32), np.asarray(runs["noise"], np.float32), runs["weight"]
    if first:
        vp = case["sampler"] in VARIANCE_PRESERVING
        x = start * np.float32(np.sqrt(np.float64(plan.sigmas[0]) ** 2 + 1) if vp else 1.0)
    else:
        x = start * np.float32(plan.init_sigma)
    history = np.zeros((1, HISTORY, *x.shape[1:]), np.float32)
    for index, row in enumerate(plan.coefficients):
        model_input = x / np.sqrt(row[1] ** 2 + 1)  # what the UNet sees: every scheduler's own model input
        output = weight * model_input + 0.01 * row[0] / 1000
        x, history = one_step(output, x, row, history, noise[index])
        x = np.asarray(x)
    np.testing.assert_allclose(x, case["final"], rtol=1e-4, atol=2e-5)


def test_engine_noise_fixture_is_what_the_engine_draws():
    """The PyTorch references of the stochastic samplers drew tests/fixtures/engine-noise.npz: still the engine's."""
    import sys

    sys.path.insert(0, str(FIXTURES.parent.parent / "scripts"))
    from make_engine_noise import engine_noise

    np.testing.assert_array_equal(engine_noise(), np.load(FIXTURES / "engine-noise.npz")["noise"])


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


def test_images_equal_pytorch_pipeline(tiny_pt):
    """Each new sampler × a schedule type or two, 6-8 steps with CFG, through the served step program's body:
    within 1 level of PyTorch's pipeline (SDE and LCM with the engine's noise fed to PyTorch's scheduler)."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.host.planning.tokens import tokenize

    arrays = np.load(FIXTURES / "a1111-samplers.npz")
    latents = np.load(FIXTURES / "tiny-pt-expected.npz")["latents"]  # [1, 4, 8, 8]
    scheduler = json.loads((FIXTURES / "tiny-pt" / "scheduler" / "scheduler_config.json").read_text())
    config = SamplerConfig.from_scheduler_config(scheduler)  # the checkpoint's, as the engine reads it
    tokenizers = (tiny_pt.networks.tokenizer, tiny_pt.networks.tokenizer_2)
    ids = tokenize(tokenizers, PYTORCH["prompt"])[0][None]  # [1, 2, 77]
    negative = tokenize(tokenizers, PYTORCH["negative_prompt"])[0][None]
    modules, failures = Modules.of(tiny_pt.networks), []
    for case in PYTORCH["images"]:
        clipping = dataclasses.replace(config, clip_sample=case.get("clip_sample"))  # DDIM: as the reference ran
        plan = clipping.plan(case["steps"], case["sampler"], case["schedule_type"])
        np.testing.assert_allclose(plan.timesteps, case["timesteps"], rtol=1e-5, atol=1e-4)
        image = run_local(
            modules,
            tiny_pt.params,
            ids,
            negative,
            np.array([True]),
            np.array([PYTORCH["guidance_scale"]], np.float32),
            latents,
            plan,
        )[0].astype(np.int16)
        expected = np.round(arrays[case["name"]][0] * 255)  # [64, 64, 3]
        worst, share = np.abs(image - expected).max(), np.mean(image != expected)
        if worst > 1 or share >= 0.02:
            failures.append(f"{case['name']}: max {worst}, {share:.1%} differ")
    assert not failures, failures


def test_combinations_that_make_no_sense_are_one_sentence():
    config = _config()
    for sampler, schedule, message in [
        ("DDIM", "Karras", "DDIM has no Karras schedule type; choose Automatic or SGM Uniform."),
        ("Euler a", "Exponential", "Euler a has no Exponential schedule type; choose Automatic or SGM Uniform."),
        ("LCM", "SGM Uniform", "LCM has no SGM Uniform schedule type; choose Automatic."),
        (
            "DPM++ 2M Karras",
            "Exponential",
            "DPM++ 2M Karras already has the Karras schedule type; pick DPM++ 2M to use Exponential.",
        ),
        ("Heun", "Beta", "Unknown schedule type 'Beta'; choose one of: Automatic, Karras, Exponential, SGM Uniform."),
    ]:
        with pytest.raises(InvalidInput) as error:
            config.plan(8, sampler, schedule)
        assert str(error.value) == message
    with pytest.raises(InvalidInput, match=r"^LCM runs at most 50 steps; got 51\.$"):
        config.plan(51, "LCM")
    # A1111's old combined names: the same plan as the sampler with its schedule type.
    for combined, (base, schedule) in [
        ("DPM++ 2M SDE Karras", ("DPM++ 2M SDE", "Karras")),
        ("dpm++ 2m sde exponential", ("DPM++ 2M SDE", "Exponential")),
        ("LMS Karras", ("LMS", "Karras")),
        ("DPM++ 2M Karras", ("DPM++ 2M", "Karras")),
    ]:
        np.testing.assert_array_equal(
            config.plan(7, combined).coefficients, config.plan(7, base, schedule).coefficients
        )


def test_every_sampler_and_schedule_type_plans_every_step_count():
    """Finite rows for 1..50 steps of every allowed pair; Heun runs 2 rows a step but its last."""
    config = _config()
    for name in SAMPLER_NAMES:
        base, own = resolve(name)
        for schedule in SCHEDULES_OF[base] if own == "Automatic" else (own,):
            for steps in range(1, 51):
                plan = config.plan(steps, name, schedule)
                assert np.isfinite(plan.coefficients).all(), (name, schedule, steps)
                assert plan.rows == (2 * steps - 1 if base == "heun" else steps)
                assert not plan.coefficients[0, [4, 6, 7, 8]].any()  # no history read at row 0
    assert set(SCHEDULE_TYPES) == {"Automatic", "Karras", "Exponential", "SGM Uniform"}


def test_no_sampler_schedule_type_or_step_count_compiles(engine):
    """Every sampler × each of its schedule types, at a few step counts, through the warmed engine: no compile."""
    before = engine.compile_count
    for name in [n for n in SAMPLER_NAMES if resolve(n)[1] == "Automatic"]:
        for schedule in SCHEDULES_OF[resolve(name)[0]]:
            for steps in (1, 3):
                result = generate(
                    engine,
                    "a red kite",
                    seed=3,
                    randomize_seed=False,
                    steps=steps,
                    sampler=name,
                    schedule_type=schedule,
                )
                assert result.steps == steps
                text = result.parameters[0]
                assert f"Sampler: {name}," in text
                assert (f"Schedule type: {schedule}" in text) == (schedule != "Automatic")
    assert engine.compile_count == before


def test_lcm_lora_preset_uses_its_lora_when_there_and_says_what_to_fetch_when_not(tmp_path, caplog):
    from pipeline.__main__ import build_parser
    from pipeline.config import engine_config
    from pipeline.contract.presets import get_preset
    from pipeline.contract.request import RequestRules, parse_request

    preset = get_preset("lcm-lora-4step")
    assert (preset.sampler, preset.steps, preset.guidance_scale, preset.cfg) == ("lcm", 4, 1.5, True)
    args = ["generate", "--prompt", "a fox", "--out", str(tmp_path), "--preset", "lcm-lora-4step", "--model", "tiny"]
    with caplog.at_level("WARNING"):
        config = engine_config(build_parser().parse_args([*args, "--lora-dir", str(tmp_path)]))
    assert config.default_lora is None and "latent-consistency/lcm-lora-sdxl" in caplog.text
    (tmp_path / "lcm-lora-sdxl.safetensors").write_bytes(b"")  # RequestRules reads the names only
    config = engine_config(build_parser().parse_args([*args, "--lora-dir", str(tmp_path)]))
    rules = RequestRules.of(config)
    assert config.default_lora == "lcm-lora-sdxl:1" and rules.sampler == "LCM" and rules.steps == 4
    assert parse_request("a fox", rules=rules).loras == (("lcm-lora-sdxl", 1.0, 1.0),)
    assert "<lora:lcm-lora-sdxl:1>" in parse_request("a fox", rules=rules).written_prompt
