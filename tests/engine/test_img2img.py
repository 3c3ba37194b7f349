"""Image to image and inpainting (issue 28) equal diffusers' PyTorch pipelines: the truncated plan
(pipeline/host/planning/image_plan.py), the VAE's posterior mean and the start latents (pipeline/device/vae.py,
denoise.py), and the engine's pictures for every fixture case, 4- and 9-channel UNets alike.

The fixtures (scripts/make_image_fixtures.py) are diffusers' `StableDiffusionXLImg2ImgPipeline` and
`StableDiffusionXLInpaintPipeline` on tests/fixtures/tiny-pt (and a 9-channel inpainting UNet,
tests/fixtures/tiny-pt-inpaint), with the posterior mean and the engine's noise.
"""

from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT
from reference import prepare_image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.image_inputs import prepare_mask, steps_to_run
from pipeline.contract.request import parse_request
from pipeline.contract.sampler_names import SAMPLER_NAMES
from pipeline.device.denoise import initial_latents, start_local
from pipeline.host.planning.image_plan import image_plan
from pipeline.host.planning.sampler_plan import COEFFICIENTS, SamplerConfig

MANIFEST = json.loads((FIXTURES / "image-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "image-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}
SIZE = MANIFEST["height"]
CONFIG = SamplerConfig.from_scheduler_config(MANIFEST["scheduler"])
#: The fixture's sampler ids -> A1111's names (what a request says).
SAMPLERS = {ident: name for name, ident in SAMPLER_NAMES.items()}
PICTURE, MASK = FIXTURES / "image-input.png", FIXTURES / "image-mask.png"


def _inpainting(case) -> bool:
    """diffusers' inpainting pipeline starts from pure noise at strength 1; its img2img pipeline does not."""
    return case["pipeline"] == "StableDiffusionXLInpaintPipeline"


def _image_plan(case):
    full = CONFIG.plan(case["steps"], case["sampler"])
    return full, image_plan(full, steps_to_run(case["steps"], case["strength"]), pure_noise=_inpainting(case))


@pytest.fixture(scope="module")
def inpaint_engine(tmp_path_factory):
    """tiny-pt with the 9-channel UNet of tests/fixtures/tiny-pt-inpaint (fp16 files), 2 devices, started with
    --no-speed-levers (as a server that only inpaints might be) and one text window (the prompts here are short):
    fewer programs to compile."""
    from pipeline.generator import Generator

    target = tmp_path_factory.mktemp("tiny-pt-inpaint")
    for entry in TINY_PT.iterdir():
        if entry.name not in ("unet", "model_index.json"):
            (target / entry.name).symlink_to(entry.resolve())
    (target / "unet").symlink_to((FIXTURES / "tiny-pt-inpaint" / "unet").resolve())
    shutil.copy(FIXTURES / "tiny-pt-inpaint" / "model_index.json", target / "model_index.json")
    generator = Generator.from_pretrained(
        str(target),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=4,
        dtype="float32",
        variant="fp16",
        devices=jax.devices()[:FEATURE_DEVICES],
        speed_levers=False,
        prompt_windows=1,
    )
    generator.warmup()
    return generator


# ---- the truncated plan ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_truncated_plan_runs_diffusers_timesteps(name):
    case = CASES[name]
    full, image = _image_plan(case)
    plan = image.plan
    start_index = case["steps"] - steps_to_run(case["steps"], case["strength"])  # rows of the full plan skipped
    assert plan.timesteps.tolist() == case["timesteps_run"]
    assert plan.steps == len(case["timesteps_run"]) == case["steps"] - start_index
    assert plan.coefficients.shape == (plan.steps, len(COEFFICIENTS)) and plan.sigmas.shape == (plan.steps + 1,)
    # Every row but the first is the full plan's own; the first has no D_prev term, and its D weight is 1 - a.
    assert np.array_equal(plan.coefficients[1:], full.coefficients[start_index + 1 :])
    first, row = plan.coefficients[0], full.coefficients[start_index]
    assert first[4] == 0 and np.array_equal(first[[0, 1, 2, 5]], row[[0, 1, 2, 5]])
    assert first[3] == pytest.approx(1 - first[2], abs=1e-6)
    if case["sampler"].startswith("dpmpp") and 0 < start_index < case["steps"] - 1:
        assert row[4] != 0  # txt2img would take a second-order step here: the truncation changes it
    assert plan.sigmas[-1] == 0


def test_strength_picks_steps_as_diffusers_get_timesteps():
    assert [steps_to_run(4, s) for s in (1.0, 0.5, 0.25, 0.49)] == [4, 2, 1, 1]
    assert steps_to_run(10, 0.3) == 3  # 10 × 0.3 = 3.0000000000000004
    assert steps_to_run(100, 0.29) == 28  # 100 × 0.29 = 28.999999999999996: int() truncates, as diffusers does
    plan = image_plan(CONFIG.plan(4, "dpmpp_2m"), 1, pure_noise=False).plan
    assert plan.steps == 1 and plan.coefficients[0, 4] == 0 and plan.sigmas[-1] == 0  # one first-order step to 0


@pytest.mark.parametrize("steps, strength", [(4, 0.2), (1, 0.99), (100, 0.009), (25, 0.03)])
def test_strength_that_runs_no_step_is_one_sentence_with_advice_that_works(steps, strength):
    with pytest.raises(InvalidInput) as error:
        steps_to_run(steps, strength)
    message = str(error.value)
    assert message.startswith(f"Strength {strength:g} with {steps} steps leaves no step to run")
    assert "\n" not in message and message.endswith(".")
    least = float(message.rsplit("at least ", 1)[1].split(" ")[0])
    assert steps_to_run(steps, least) == 1  # the advice works
    with pytest.raises(InvalidInput) as at_the_edge:  # the request edge says the same
        parse_request("a cat", steps=steps, init_image=PICTURE, strength=strength)
    assert str(at_the_edge.value) == message


def test_start_sigma_and_image_weight_at_full_strength():
    for sampler in list(SAMPLER_NAMES.values())[:4]:  # one row a step (Heun: two)
        full = CONFIG.plan(8, sampler)
        img2img = image_plan(full, 8, pure_noise=False)
        inpaint = image_plan(full, 8, pure_noise=True)
        assert (img2img.image_weight, img2img.plan.init_sigma) == (1.0, float(full.sigmas[0]))  # x0 + sigma_max·n
        assert (inpaint.image_weight, inpaint.plan.init_sigma) == (0.0, full.init_sigma)  # txt2img's start
        assert np.array_equal(inpaint.plan.coefficients, full.coefficients)  # nothing truncated at strength 1
        half = image_plan(full, 4, pure_noise=True)
        assert (half.image_weight, half.plan.init_sigma) == (1.0, float(full.sigmas[4]))


# ---- the device pieces against the PyTorch fixtures ----------------------------------------------------------------


def _encoder(params, modules):
    """The picture's latents by the engine's VAE body (`vae.encode_local`), jitted on one device: [1, 4, 8, 8]."""
    from pipeline.device.vae import encode_local

    pixels = prepare_image(PICTURE, SIZE, SIZE)
    repaint = prepare_mask(MASK, SIZE, SIZE, image_size=tuple(MANIFEST["inputs"]["size"]))
    assert np.array_equal(pixels, ARRAYS["fit_image"]) and np.array_equal(repaint, ARRAYS["fit_mask"] == 1)
    encode = jax.jit(lambda p, x, k: encode_local(modules, p, x, k))
    latents = encode(params, pixels[None], np.ones((1, SIZE, SIZE), bool))
    masked = encode(params, pixels[None], ~repaint[None])  # the same program: what a 9-channel UNet reads
    assert not np.allclose(np.asarray(latents), np.asarray(masked))
    return np.asarray(latents)


@pytest.fixture(scope="module")
def x0(inpaint_engine):
    """The picture's latents per UNet kind: float32 weights (tiny-pt), and the fp16 files the inpainting
    checkpoint was made from (its VAE read from *.fp16.safetensors, as the reference's was)."""
    from pipeline.checkpoint.loading import load_model
    from pipeline.device.modules import Modules

    model = load_model(str(TINY_PT), dtype="float32")
    inpaint_vae = {"vae": jax.device_get(inpaint_engine._params["vae"])}
    return {
        4: _encoder(model.params, Modules.of(model.networks)),
        9: _encoder(inpaint_vae, inpaint_engine.programs.modules),
    }


def test_vae_encode_is_the_posterior_mean_of_pytorch(x0):
    assert x0[4].shape == (1, 4, SIZE // 8, SIZE // 8) and x0[4].dtype == np.float32
    np.testing.assert_allclose(x0[4], ARRAYS["image_latents"], atol=2e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_start_latents_equal_diffusers(x0, name):
    """The start latents in the engine's VE scale are diffusers' prepare_latents output (DPM's VP x sqrt(s^2 + 1))."""
    case = CASES[name]
    _, image = _image_plan(case)
    seeds = np.array([case["seed"]], np.uint32)
    latents, noise = _start(
        seeds, np.float32(image.plan.init_sigma), x0[case["unet_channels"]], np.float32(image.image_weight)
    )
    np.testing.assert_array_equal(np.asarray(noise), np.asarray(initial_latents(seeds, SIZE, SIZE, 8)))
    expected = ARRAYS[f"start_{name}"]
    if case["sampler"].startswith("dpmpp"):  # DPM-Solver keeps the variance-preserving sample
        expected = expected * np.sqrt(np.float64(image.plan.sigmas[0]) ** 2 + 1)
    np.testing.assert_allclose(np.asarray(latents), expected, atol=2e-5 * max(1.0, image.plan.init_sigma), rtol=1e-5)


#: The engine's start body (`denoise.start_local`), jitted once for the fixtures' size.
_start = jax.jit(lambda s, sigma, x, w: start_local(s, sigma, x, w, height=SIZE, width=SIZE, vae_scale_factor=8))


# ---- the engine's pictures ------------------------------------------------------------------------------------------


def _request(engine, case, **changes):
    fields = {
        "negative_prompt": case["negative_prompt"] or "",
        "guidance_scale": case["guidance_scale"],
        "seed": case["seed"],
        "steps": case["steps"],
        "sampler": SAMPLERS[case["sampler"]],
        "init_image": PICTURE,
        "strength": case["strength"],
        **({"mask_image": MASK} if _inpainting(case) else {}),
        **changes,
    }
    return engine.request(case["prompt"], **fields)


def _assert_matches(result, name: str) -> None:
    got = np.asarray(result.images[0]).astype(np.int16)  # image 0: the case's seed
    expected = ARRAYS[name][0].astype(np.int16)  # [64, 64, 3]
    assert np.abs(got - expected).max() <= 1, name
    assert np.mean(got != expected) < 0.02, name


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n]["unet_channels"] == 4))
def test_four_channel_pictures_equal_diffusers(feature_engine, name):
    """img2img and 4-channel inpainting through the real engine: within 1 level, the steps int(steps × strength)."""
    case = CASES[name]
    before = feature_engine.compile_count
    result = feature_engine.generate(_request(feature_engine, case))
    _assert_matches(result, name)
    assert result.steps == len(case["timesteps_run"])
    assert f"Denoising strength: {case['strength']:g}" in result.parameters[0]
    assert feature_engine.compile_count == before


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n]["unet_channels"] == 9))
def test_nine_channel_inpainting_equals_diffusers(inpaint_engine, name):
    case = CASES[name]
    before = inpaint_engine.compile_count
    _assert_matches(inpaint_engine.generate(_request(inpaint_engine, case)), name)
    assert inpaint_engine.compile_count == before


def test_nine_channel_server_serves_text_to_image_and_every_strength_without_compiling(inpaint_engine):
    """The inpainting UNet reads [x, mask, masked picture]: without a picture it gets diffusers' all-white mask
    over a grey picture; every strength, with and without a mask, runs on the start-up programs, each a picture of
    its own (but strength 1 without a mask: that is text to image)."""
    assert inpaint_engine.programs.inpainting_unet and inpaint_engine.programs.modules.unet.in_channels == 9
    assert inpaint_engine._params["unet"]["conv_in"]["kernel"].shape[2] == 9  # HWIO: 9 input channels
    before = inpaint_engine.compile_count
    seen = set()
    for strength in (0.3, 0.6, 1.0):
        for mask in (None, MASK):
            result = inpaint_engine.generate(
                inpaint_engine.request("a red fox", seed=3, init_image=PICTURE, mask_image=mask, strength=strength)
            )
            assert result.steps == int(4 * strength)
            seen.add(np.asarray(result.images[0]).tobytes())
    text = inpaint_engine.generate(inpaint_engine.request("a red fox", seed=3))
    assert text.steps == 4 and "Denoising strength" not in text.parameters[0]
    # Strength 1 without a mask repaints everything from pure noise over a grey picture, as diffusers' inpainting
    # pipeline does with a white mask: the picture is not read, and that is text to image.
    assert np.asarray(text.images[0]).tobytes() in seen
    assert len(seen) == 6 and inpaint_engine.compile_count == before


def test_a_server_without_levers_compiles_the_plain_step_and_refuses_levers(inpaint_engine):
    """--no-speed-levers: one `step` program per size and guidance mode; cfg_end/deepcache refused in one
    sentence, before anything runs."""
    labels = [key.label for key in inpaint_engine.program_keys()]
    assert labels == [
        "encode cfg",
        "cross_kv cfg",  # the text's cross-attention table (--cross-attention-cache: on CPU devices, the default)
        "encode_image 64x64",
        "start 64x64",
        "step 64x64 cfg",
        "preview 64x64",
        "decode 64x64",
    ]
    for levers in ({"cfg_end": 0.5}, {"deepcache": 2}):
        with pytest.raises(
            InvalidInput,
            match=r"^This server runs every step whole and guided \(started with "
            r"--no-speed-levers\): cfg_end and deepcache must be 1\.$",
        ):
            inpaint_engine.request("a red fox", **levers)


# ---- strength 1 and the whole picture repainted ---------------------------------------------------------------------


def test_inpainting_everything_at_strength_1_is_text_to_image_bit_for_bit(feature_engine):
    """diffusers' inpainting pipeline with an all-white mask at strength 1 starts from pure noise and blends
    nothing: exactly txt2img from the same seeds. Its img2img pipeline at strength 1 starts from x0 + sigma_max·n:
    a trace of the picture stays (the tiny random UNet keeps little of it, but some)."""
    white = np.full((SIZE, SIZE), 255, np.uint8)
    fields = {"seed": 1234, "guidance_scale": 6.5, "steps": 4, "sampler": "Euler"}
    txt2img = feature_engine.generate(feature_engine.request("a cozy cabin", **fields))
    everything = feature_engine.generate(
        feature_engine.request("a cozy cabin", init_image=PICTURE, mask_image=_png(white), strength=1, **fields)
    )
    img2img = feature_engine.generate(feature_engine.request("a cozy cabin", init_image=PICTURE, strength=1, **fields))
    for a, b in zip(txt2img.images, everything.images, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    difference = np.abs(np.asarray(img2img.images[0]).astype(np.int16) - np.asarray(txt2img.images[0]))
    assert np.mean(difference > 1) > 0.01
    assert "Denoising strength: 1" in everything.parameters[0]


def _png(levels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(levels).save(buffer, format="PNG")
    return buffer.getvalue()
