"""Samplers: schedules equal diffusers' PyTorch schedulers, guidance means what diffusers means, presets apply."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.fused import ancestral_step, euler_step
from pipeline.config import SDXL_BASE
from pipeline.device.sampler_update import scale_model_input
from pipeline.errors import InvalidInput
from pipeline.host.plan import SAMPLER_NAMES, SamplerConfig
from pipeline.presets import PRESET_NAMES, get_preset, load_presets
from pipeline.styles import DEFAULT_STYLE, load_styles

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
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
    assert plan.coefficients.shape == (case["steps"], 6)


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
    for name, ident in SAMPLER_NAMES.items():
        for steps in (1, 2, 50, 100):
            plan = config.plan(steps, name)
            assert plan.sampler == ident and plan.coefficients.shape == (steps, 6) and plan.label == name
            assert np.isfinite(plan.coefficients).all()
            adds_noise = (plan.coefficients[:, 5] != 0).any()  # only Euler a does, before its final step
            assert adds_noise == (ident == "euler_ancestral" and steps > 1)
            assert plan.coefficients[0, 4] == 0  # the first step has no previous prediction
    assert config.plan(4, "dpm++ 2m karras").sampler == "dpmpp_2m_karras"  # A1111's names, any case
    with pytest.raises(InvalidInput, match="Unknown sampler 'LMS'"):
        config.plan(4, "LMS")
    with pytest.raises(InvalidInput, match="Steps must be between 1 and 1000; got 0"):
        config.plan(0, "Euler")


# ---- presets (no JAX) ---------------------------------------------------------------------------------------------


def test_presets_file_holds_every_recipe_of_the_issue():
    presets = load_presets()
    assert tuple(presets) == PRESET_NAMES
    lightning = presets["lightning-4step"]
    assert (lightning.model, lightning.steps, lightning.sampler, lightning.timestep_spacing, lightning.cfg) == (
        SDXL_BASE, 4, "euler", "trailing", False,
    )  # fmt: skip
    assert lightning.unet == "ByteDance/SDXL-Lightning:sdxl_lightning_4step_unet.safetensors"
    turbo = presets["turbo"]
    assert (turbo.sampler, turbo.timestep_spacing, turbo.cfg, turbo.height, turbo.width) == (
        "euler_ancestral", "trailing", False, 512, 512,
    )  # fmt: skip
    assert presets["sdxl-base"].cfg and presets["sdxl-base"].steps == 25 and presets["sdxl-base"].unet is None


def test_preset_resolution_tiny_gets_sampler_settings_only_and_flags_win():
    lightning = get_preset("lightning-8step")
    own = resolve(lightning)
    assert own["unet"].endswith("sdxl_lightning_8step_unet.safetensors")
    assert (own["height"], own["width"], own["variant"]) == (1024, 1024, None)
    tiny = resolve(lightning, model="tiny", steps=None)
    assert tiny == {
        "model": "tiny", "steps": 8, "sampler": "euler", "timestep_spacing": "trailing", "cfg": False,
        "guidance_scale": 0.0, "preset": "lightning-8step",
    }  # fmt: skip
    assert resolve(lightning, model="tiny", steps=3, sampler="euler_ancestral")["steps"] == 3
    with pytest.raises(InvalidInput, match="Unknown preset 'lightning-3step'; choose one of: sdxl-base"):
        get_preset("lightning-3step")


def test_malformed_presets_file_fails_in_one_line(tmp_path):
    path = tmp_path / "presets.json"
    path.write_text(json.dumps({"fast": {"description": "x"}}))
    with pytest.raises(InvalidInput, match=r"Preset 'fast' .* is malformed \(cfg, guidance_scale"):
        load_presets(path)
    entry = {**dataclasses.asdict(get_preset("turbo")), "timestep_spacing": "karras"}
    entry.pop("name")
    path.write_text(json.dumps({"fast": entry}))
    with pytest.raises(InvalidInput, match="Unsupported timestep spacing 'karras'"):
        load_presets(path)


def test_cli_and_app_flags_apply_a_preset():
    import app
    from pipeline.__main__ import _settings, build_parser

    def cli(*flags):
        return _settings(build_parser().parse_args(["generate", "--prompt", "p", "--out", "o", *flags]))

    assert cli("--preset", "lightning-2step") == {
        "model": SDXL_BASE, "unet": "ByteDance/SDXL-Lightning:sdxl_lightning_2step_unet.safetensors", "steps": 2,
        "sampler": "Euler", "timestep_spacing": "trailing", "cfg": False, "guidance_scale": 0.0,
        "preset": "lightning-2step", "height": 1024, "width": 1024,
    }  # fmt: skip
    on_tiny = cli("--preset", "turbo", "--model", "tiny", "--guidance-scale", "2")
    assert (on_tiny["steps"], on_tiny["height"], on_tiny["sampler"], on_tiny["guidance_scale"]) == (
        1, 128, "Euler a", 2.0,
    )  # fmt: skip
    assert "unet" not in on_tiny and "variant" not in on_tiny
    plain = cli("--model", "tiny", "--no-cfg", "--timestep-spacing", "linspace", "--steps-offset", "0")
    assert (plain["cfg"], plain["timestep_spacing"], plain["steps_offset"], plain["steps"]) == (False, "linspace", 0, 4)
    assert "sampler" not in plain and "preset" not in plain  # the checkpoint's own scheduler class

    args = app.parse_args(["--preset", "turbo"])
    assert (args.model, args.variant, args.sizes, args.height, args.steps, args.cfg) == (
        "stabilityai/sdxl-turbo", "fp16", None, 512, 1, False,
    )  # fmt: skip
    args = app.parse_args(["--preset", "lightning-4step", "--model", "tiny", "--sampler", "euler_ancestral"])
    assert (args.unet, args.steps, args.sampler, args.cfg, args.height) == (None, 4, "Euler a", False, 128)
    assert len(args.sizes) == 3  # the tiny model's offered sizes, as without a preset


# ---- images against diffusers' PyTorch pipeline (tests/fixtures/tiny-pt, shared with the checkpoint loader) ------


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


def test_trailing_and_guidance_0_and_1_equal_pytorch_pipeline(tiny_pt):
    """PyTorch's trailing, guidance-0 images: the guidance-free program, and the CFG program at g = 0 and g = 1."""
    from pipeline.device.modules import Modules
    from pipeline.host.loop import run_local
    from pipeline.host.tokens import tokenize

    manifest = json.loads((FIXTURES / "tiny-pt-expected.json").read_text())
    arrays = np.load(FIXTURES / "tiny-pt-expected.npz")
    cases = [c for c in manifest["cases"] if c["timestep_spacing"] == "trailing"]
    assert sorted(c["steps"] for c in cases) == [2, 4] and {c["guidance_scale"] for c in cases} == {0.0}
    modules = Modules.of(tiny_pt.pipeline)
    tokenizers = (tiny_pt.pipeline.tokenizer, tiny_pt.pipeline.tokenizer_2)
    trailing = SamplerConfig.from_scheduler_config(manifest["scheduler"], timestep_spacing="trailing")
    assert trailing.steps_offset == 1 and trailing.sampler == "euler"

    def run(sampler, steps, prompt, negative, has_negative, guidance):  # -> uint8 [b, 64, 64, 3] as int
        b = len(guidance)
        ids = np.stack([tokenize(tokenizers, prompt)] * b)  # [b, 2, 77]
        negative_ids = np.stack([tokenize(tokenizers, negative)] * b)  # [b, 2, 77]
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
    from pipeline.device.modules import Modules
    from pipeline.host.loop import run_local
    from pipeline.host.tokens import tokenize

    manifest = json.loads((FIXTURES / "tiny-pt-expected.json").read_text())
    case = next(c for c in manifest["cases"] if c["name"] == name)
    expected = np.round(np.load(FIXTURES / "tiny-pt-expected.npz")[name][0] * 255)  # [64, 64, 3]
    latents = np.load(FIXTURES / "tiny-pt-expected.npz")["latents"]  # [1, 4, 8, 8]
    config = SamplerConfig.from_scheduler_config(manifest["scheduler"])
    plan = config.plan(case["steps"], case["sampler"])
    assert plan.timesteps.tolist() == case["timesteps"]
    tokenizers = (tiny_pt.pipeline.tokenizer, tiny_pt.pipeline.tokenizer_2)
    negative = case["negative_prompt"]
    image = run_local(
        Modules.of(tiny_pt.pipeline), tiny_pt.params, tokenize(tokenizers, case["prompt"])[None],
        tokenize(tokenizers, negative or "")[None], np.array([negative is not None]),
        np.array([case["guidance_scale"]], np.float32), latents, plan,
    )[0].astype(np.int16)  # fmt: skip
    assert np.abs(image - expected).max() <= 1, name
    assert np.mean(image != expected) < 0.02, name


# ---- the engine: the guidance-free program, presets, Euler-ancestral across device counts ----------------------

PROMPT = "a red fox in fresh snow"


def _pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images]).astype(np.int16)  # [B, H, W, 3]


def test_engine_guidance_0_and_1_give_one_image_5_guides(engine):
    zero = _pixels(engine.generate(PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=0.0))
    one = _pixels(engine.generate(PROMPT, seed=11, guidance_scale=1.0))
    five = _pixels(engine.generate(PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=5.0))
    assert np.array_equal(zero, one) and np.mean(five != zero) > 0.5


@pytest.fixture(scope="module")
def lightning(tiny_dir):
    """The app's own start-up path with `--preset lightning-4step` on the tiny checkpoint (its sampler settings)."""
    from conftest import TEST_SIZE, TEST_STEPS

    import app

    args = app.parse_args([
        "--model", str(tiny_dir), "--preset", "lightning-4step", "--dtype", "float32",
        "--height", str(TEST_SIZE), "--width", str(TEST_SIZE), "--steps", str(TEST_STEPS), "--no-progress",
    ])  # fmt: skip
    return app.load_generator(args)


def test_guidance_free_program_compiles_once_and_never_again(lightning):
    assert lightning.sampler.cfg is False and lightning.sampler.timestep_spacing == "trailing"
    keys = lightning.program_keys()
    assert all(key.cfg is False for key in keys if key.cfg is not None)  # only guidance-free programs are served
    assert all(lightning.programs.is_compiled(key) for key in keys) and lightning.compile_count >= len(keys)
    before = lightning.compile_count
    first = lightning.generate(PROMPT, seed=3, guidance_scale=0.0)
    for i, guidance in enumerate((1.0, 7.5, 20.0)):
        result = lightning.generate(f"{PROMPT} {i}", negative_prompt="ugly " * i, seed=100 + i, guidance_scale=guidance)
        assert result.negative_prompt == "" and "CFG scale: 0," in result.parameters[0]
    again = lightning.generate(PROMPT, negative_prompt="anything", seed=3, guidance_scale=12.0)
    assert np.array_equal(_pixels(first), _pixels(again))  # negative prompt and guidance are ignored
    assert lightning.compile_count == before
    text = first.parameters[0]
    assert "Steps: 2, Sampler: Euler," in text and text.endswith("Timestep spacing: trailing")


def test_page_hides_guidance_and_negative_prompt_and_api_says_they_are_ignored(lightning):
    import app

    demo = app.build_demo(lightning, examples=[])
    try:
        config = demo.get_config_file()
        labels = {c["props"].get("label"): c["props"] for c in config["components"] if "label" in c["props"]}
        assert labels["Guidance scale"]["visible"] is False and labels["Negative prompt"]["visible"] is False
        assert labels["Style"]["visible"] is not False
        description = next(d["api_description"] for d in config["dependencies"] if d["api_name"] == "generate")
        assert app.NO_CFG_NOTE in description
        texts = {c["props"].get("elem_id"): c["props"].get("value") for c in config["components"]}
        assert "preset lightning-4step: Euler, trailing spacing, no CFG" in texts["server-settings"]  # advanced
        assert "spacing" not in texts["header"] and "CFG" not in texts["header"]  # no jargon for visitors
    finally:
        app.close_demo(demo)
    # The API still takes both (named, optional); its status line says they were ignored.
    files = app._RunFiles()
    try:
        generate = app.make_generate_fn(lightning, load_styles(), None, files)
        gallery, seed, status = generate(PROMPT, "blurry", DEFAULT_STYLE, 7.0, 5, False)
        assert len(gallery) == lightning.num_images and seed == 5 and app.NO_CFG_NOTE in status
        # gradio_client sends the page's defaults unasked: no note for them, only for values that differ.
        assert app.NO_CFG_NOTE not in generate(PROMPT, "", DEFAULT_STYLE, app.DEFAULT_GUIDANCE, 5, False)[2]
        assert app.NO_CFG_NOTE in generate(PROMPT, "", DEFAULT_STYLE, 1.0, 5, False)[2]
    finally:
        files.cleanup()


def test_cli_preset_turbo_ancestral_same_images_on_4_and_8_devices(tiny_dir, tmp_path):
    """Euler-ancestral noise comes from each image's own seed: 4 devices give images 0-3 of 8 devices, bit for bit."""
    from conftest import TEST_SIZE, TEST_STEPS

    from pipeline.generator import Generator

    eight = Generator.from_pretrained(
        str(tiny_dir), height=TEST_SIZE, width=TEST_SIZE, steps=TEST_STEPS, dtype="float32",
        sampler="euler_ancestral", timestep_spacing="trailing", prediction_type="v_prediction", cfg=False,
    )  # fmt: skip
    expected = eight.generate(PROMPT, seed=42)
    done = subprocess.run(
        [
            sys.executable, "-m", "pipeline", "generate", "--model", str(tiny_dir), "--preset", "turbo",
            "--prediction-type", "v_prediction", "--steps", str(TEST_STEPS), "--height", str(TEST_SIZE),
            "--width", str(TEST_SIZE), "--dtype", "float32", "--prompt", PROMPT, "--seed", "42",
            "--guidance-scale", "7", "--out", str(tmp_path), "--json",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "warning: no classifier-free guidance" in done.stderr
    summary = json.loads(done.stdout)
    assert summary["seeds"] == expected.seeds[:4] and summary["compiles_after_warmup"] == 0
    from PIL import Image

    got = np.stack([np.asarray(Image.open(p)) for p in summary["images"]]).astype(np.int16)
    assert np.array_equal(got, _pixels(expected)[:4])
    text = Image.open(summary["images"][0]).info["parameters"]
    assert "Steps: 2, Sampler: Euler a, v-prediction, CFG scale: 0," in text and "Timestep spacing: trailing" in text
    assert len({_pixels(expected)[i].tobytes() for i in range(8)}) == 8 and _pixels(expected).std() > 1
