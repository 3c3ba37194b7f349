"""The generator (pipeline/generator.py) on the tiny SDXL-shaped checkpoint, 8 virtual CPU devices: one image per
device, seeds, traced inputs that never recompile, parameters, device counts, batch and dtype."""

from __future__ import annotations

import io
import random
import re

import jax
import numpy as np
import pytest
from conftest import FEATURE_DEVICES, TEST_SIZE, TEST_STEPS, generate
from PIL import Image

from pipeline.checkpoint.loading import load_model
from pipeline.contract.errors import InvalidInput
from pipeline.generator import Generator


def pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image) for image in result.images])  # [B, H, W, 3]


def test_weights_and_networks_bfloat16_own_modules(tiny_dir):
    from pipeline.device.nets.unet import UNet2DConditionModel

    loaded = load_model(str(tiny_dir), dtype="bfloat16")
    assert isinstance(loaded.networks.unet, UNet2DConditionModel)
    assert loaded.origins == dict.fromkeys(("unet", "vae", "text_encoder", "text_encoder_2"), "flax")
    assert sorted(loaded.params) == ["text_encoder", "text_encoder_2", "unet", "vae"]  # no scheduler state
    for component in ("text_encoder", "text_encoder_2", "unet", "vae"):
        assert getattr(loaded.networks, component).dtype == jax.numpy.bfloat16, component
        leaves = jax.tree_util.tree_leaves(loaded.params[component])
        assert leaves, component
        assert {str(leaf.dtype) for leaf in leaves} == {"bfloat16"}, component
    assert loaded.networks.scheduler_config["timestep_spacing"] == "leading"  # the file, whole
    assert loaded.networks.vae_scale_factor == 8


def test_one_image_per_device_params_replicated(engine):
    assert engine.device_count == len(jax.devices()) == 8
    assert engine.num_images == 8
    assert engine.device_summary == "8 × cpu"
    for leaf in jax.tree_util.tree_leaves(engine._params):
        assert leaf.sharding.is_fully_replicated and len(leaf.sharding.device_set) == 8
    result = generate(engine, "a red apple on a table", seed=3)
    assert len(result.images) == 8 and result.seeds == list(range(3, 11))
    assert all(image.size == (TEST_SIZE, TEST_SIZE) and image.mode == "RGB" for image in result.images)
    assert set(result.timings) == {"total_s", "device_s", "host_s", "first_step_s"}


def test_same_seed_same_pixels_other_seed_other_pixels(engine):
    first = generate(engine, "a lighthouse at dusk", seed=42, guidance_scale=6.0)
    again = generate(engine, "a lighthouse at dusk", seed=42, guidance_scale=6.0)
    other = generate(engine, "a lighthouse at dusk", seed=43, guidance_scale=6.0)
    np.testing.assert_array_equal(pixels(first), pixels(again))
    assert not np.array_equal(pixels(first)[0], pixels(other)[0])
    # Image i is seeded by seed + i alone: image 1 of seed 42 is image 0 of seed 43.
    np.testing.assert_array_equal(pixels(first)[1], pixels(other)[0])
    # Images of one call differ from each other (each device has its own noise).
    assert len({pixels(first)[i].tobytes() for i in range(8)}) == 8


def test_traced_inputs_change_the_image(engine):
    base = pixels(generate(engine, "a cat", seed=5, guidance_scale=5.0))
    assert not np.array_equal(base, pixels(generate(engine, "a dog", seed=5, guidance_scale=5.0)))
    assert not np.array_equal(base, pixels(generate(engine, "a cat", seed=5, guidance_scale=9.0)))
    assert not np.array_equal(base, pixels(generate(engine, "a cat", negative_prompt="blurry", seed=5)))


def test_twenty_random_calls_add_no_compilation(engine):
    rng = random.Random(0)
    words = ["cat", "dog", "castle", "neon", "forest", "portrait", "ocean", "city", "robot", "flower"]
    before = engine.compile_count
    for _ in range(20):
        prompt = " ".join(rng.choices(words, k=rng.randint(1, 30)))
        negative = " ".join(rng.choices(words, k=rng.randint(0, 5)))
        generate(engine, prompt, negative_prompt=negative, seed=rng.randrange(2**32), guidance_scale=rng.uniform(0, 20))
    assert engine.compile_count == before
    assert engine.sizes == [(TEST_SIZE, TEST_SIZE)]


#: What the other generators here need not compile (their prompts are short; nobody watches them): the 3-window
#: text programs and the previews. They keep the speed levers, so their steps are `engine`'s programs (`step_full`).
SHORT_PROMPTS = {"prompt_windows": 1, "previews": False}


def test_same_pixels_whatever_the_device_count(tiny_dir, engine):
    """2 devices against 8. Two, as `feature_engine` (tiny-pt, the tiny model's architecture) has them: its one-window
    programs are these (JAX's cache serves them once it has run; 4 devices compiled 8 programs of their own)."""
    two = Generator.from_pretrained(
        str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="float32",
        devices=jax.devices()[:FEATURE_DEVICES],
        **SHORT_PROMPTS,
    )
    assert two.num_images == 2 and two.device_summary == "2 × cpu"
    on_two = pixels(generate(two, "a windmill in a field of tulips", seed=11, guidance_scale=7.0))
    on_eight = pixels(generate(engine, "a windmill in a field of tulips", seed=11, guidance_scale=7.0))
    np.testing.assert_array_equal(on_two, on_eight[:2])
    # An ancestral sampler draws fresh noise every step: image k's noise comes from seed k alone, whatever the device
    # count (the CLI's `--preset turbo` on 4 processes' devices against 8: tests/system/test_cli.py, `long`).
    ancestral = {"seed": 42, "guidance_scale": 0.0, "sampler": "Euler a"}
    on_two = pixels(generate(two, "a windmill in a field of tulips", **ancestral))
    on_eight = pixels(generate(engine, "a windmill in a field of tulips", **ancestral))
    np.testing.assert_array_equal(on_two, on_eight[:2])
    assert len({on_eight[i].tobytes() for i in range(8)}) == 8


def test_long_prompt_is_truncated_and_reported(engine):
    words = [f"Word{i}" for i in range(60)]
    result = generate(engine, " ".join(words), seed=1)
    shown = result.truncated.split("“")[1].split("”")[0].rstrip("…").split()  # the first few dropped words
    more = re.search(r"” and (\d+) more words?\.$", result.truncated)  # the rest, counted (issue 10: fits a toast)
    total = len(shown) + (int(more.group(1)) if more else 0)
    assert 0 < len(shown) <= 8 and total < 60 and shown == words[-total:][: len(shown)]
    assert generate(engine, "a short prompt", seed=1).truncated == ""


def test_png_parameters_chunk(engine, tmp_path):
    result = generate(engine, "an owl", negative_prompt="blurry", seed=9, guidance_scale=4.5)
    paths = result.save_pngs(tmp_path)
    assert [p.name for p in paths] == sorted(p.name for p in paths) and len(paths) == 8
    text = Image.open(paths[2]).info["parameters"]
    assert text.splitlines()[0] == "an owl" and "Negative prompt: blurry" in text
    assert "Seed: 11" in text and f"Size: {TEST_SIZE}x{TEST_SIZE}" in text and "CFG scale: 4.5" in text
    assert f"Steps: {TEST_STEPS}" in text and "Model: " in text


@pytest.mark.parametrize(
    "kwargs",
    [{"seed": -1}, {"seed": 2**32}, {"guidance_scale": float("nan")}, {"guidance_scale": 1e9}, {"negative_prompt": 3}],
)
def test_bad_input_is_one_clear_sentence_and_next_call_works(engine, kwargs):
    with pytest.raises(InvalidInput) as error:
        engine.request("a cat", **kwargs)  # checked where the request enters, before the engine runs anything
    assert "\n" not in str(error.value) and str(error.value).endswith(".")
    assert len(generate(engine, "a cat", seed=0).images) == 8


def test_unsupported_size_lists_the_compiled_ones(engine):
    with pytest.raises(InvalidInput, match=f"compiled {TEST_SIZE}×{TEST_SIZE} only; got 512×512"):
        engine.request("a cat", size=(512, 512))


def test_images_per_device_two_on_two_devices(batched_engine, engine):
    """Four images as 2 devices x 2 (`--images-per-device 2`, the session's `batched_engine`): the same seeds, and
    the same images as one per device up to float rounding of a larger batch (within 1 level)."""
    assert batched_engine.num_images == 4 and batched_engine.device_summary == "2 × cpu"
    result = generate(batched_engine, "a red kite over the dunes", seed=21)
    assert result.seeds == list(range(21, 25))
    reference = pixels(generate(engine, "a red kite over the dunes", seed=21)).astype(int)[:4]  # seeds 21..24
    assert np.abs(pixels(result).astype(int) - reference).max() <= 1


def test_bfloat16_generation_is_close_to_float32(tiny_dir, engine):
    """The accelerator default (bf16 weights and activations, f32 scheduler and latents) gives sane images."""
    bf16 = Generator.from_pretrained(
        str(tiny_dir),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=TEST_STEPS,
        dtype="bfloat16",
        speed_levers=False,
        **SHORT_PROMPTS,
    )
    assert bf16.config.dtype == "bfloat16"
    got = pixels(generate(bf16, "a cat", seed=1)).astype(int)
    expected = pixels(generate(engine, "a cat", seed=1)).astype(int)
    assert got.std() > 10  # not a flat (black or grey) image
    assert np.abs(got - expected).mean() < 8  # a few 8-bit levels of bf16 rounding, no more


PROMPT = "a red fox in fresh snow"


def test_engine_guidance_0_and_1_give_one_image_5_guides(engine):
    zero = pixels(generate(engine, PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=0.0))
    one = pixels(generate(engine, PROMPT, seed=11, guidance_scale=1.0))
    five = pixels(generate(engine, PROMPT, negative_prompt="blurry, dark", seed=11, guidance_scale=5.0))
    assert np.array_equal(zero, one) and np.mean(five != zero) > 0.5


def test_the_run_plan_decides_the_whole_run_before_anything_runs(engine):
    """`engine.plan` (host/planning/run_plan.py) is host data: making it compiles and runs nothing, and it says what the
    run will do: rows, guidance, seeds, the images returned and their `parameters`, and that it runs alone."""
    compiles, runs = engine.compile_count, len(engine.recent_runs)
    run = engine.plan(engine.request(PROMPT, negative_prompt="blurry", seed=7, steps=3, sampler="DPM++ 2M"))
    assert engine.compile_count == compiles and len(engine.recent_runs) == runs
    assert (run.steps, run.first.plan.steps, run.first.plan.sampler) == (3, 3, "dpmpp_2m")
    assert run.first.guided and run.first.picture is None and run.second is None and run.merge_key is None
    assert run.first.refiner_row == run.first.plan.rows and not run.output.refined
    assert run.output.seeds == tuple(range(7, 7 + engine.images_per_call))
    prompt_ids, negative_ids, has_negative, *_ = run.conditioning.rows
    assert prompt_ids.shape[0] == negative_ids.shape[0] == engine.images_per_call and has_negative.all()
    assert len(run.output.parameters) == engine.num_images
    assert "Steps: 3" in run.output.parameters[0] and "Seed: 8" in run.output.parameters[1]
    unguided = engine.plan(engine.request(PROMPT, guidance_scale=1.0))
    assert not unguided.first.guided
    picture = io.BytesIO()
    Image.new("RGB", (TEST_SIZE, TEST_SIZE), "teal").save(picture, format="PNG")
    img2img = engine.plan(engine.request(PROMPT, steps=4, init_image=picture.getvalue(), strength=0.5))
    assert img2img.first.plan.steps == 2 and img2img.first.picture is not None  # the last 2 of 4 steps run
    assert (
        engine.plan(engine.request(PROMPT, negative_prompt="blurry", seed=7, steps=3, sampler="DPM++ 2M")).output
        == run.output
    )
