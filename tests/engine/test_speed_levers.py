"""The per-request speed levers (issue 29): DeepCache's whole and shallow UNet calls (pipeline/device/deepcache.py),
the per-step plan of cfg_end + deepcache (pipeline/host/planning/speed_plan.py), and the engine's pictures with them.

The references (tests/fixtures/speed-expected.*) are diffusers' PyTorch SDXL pipeline with the documented dynamic-CFG
callback and the `deepcache` package's DeepCacheSDHelper (scripts/make_speed_fixtures.py), with the engine's noise.
"""

from __future__ import annotations

import functools
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, REPO, TINY_PT

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD
from pipeline.contract.request import RequestRules, parse_request
from pipeline.contract.sampler_names import SAMPLER_NAMES
from pipeline.device import deepcache
from pipeline.host.planning.speed_plan import guided_steps, speed_plan

MANIFEST = json.loads((FIXTURES / "speed-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "speed-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}
#: The fixture's sampler ids -> A1111's names (what a request says).
SAMPLERS = {ident: name for name, ident in SAMPLER_NAMES.items()}


def feature_shape(unet, batch: int, latent_height: int, latent_width: int) -> tuple[int, int, int, int]:
    """The cached feature's shape for `batch` UNet rows (2b with CFG): [batch, h, w, C], NHWC at latent size."""
    return (batch, latent_height, latent_width, deepcache.cut(unet).feature_channels)


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(TINY_PT), dtype="float32")


def _unet_inputs(batch: int, seed: int = 0, size: int = 8):
    """Random UNet inputs of the tiny checkpoint's shapes: sample [B, 4, s, s], t [B], hidden, added."""
    rng = np.random.default_rng(seed)
    sample = jnp.asarray(rng.standard_normal((batch, 4, size, size)), jnp.float32)
    timesteps = jnp.full((batch,), 501.0, jnp.float32)
    hidden = jnp.asarray(rng.standard_normal((batch, 77, 96)), jnp.float32)
    pooled = jnp.asarray(rng.standard_normal((batch, 64)), jnp.float32)
    time_ids = jnp.asarray([[8 * size, 8 * size, 0, 0, 8 * size, 8 * size]] * batch, jnp.float32)
    return sample, timesteps, hidden, {"text_embeds": pooled, "time_ids": time_ids}


def _plain(unet):
    def call(params, sample, t, hidden, added):
        return unet.apply({"params": params}, sample, t, encoder_hidden_states=hidden, added_cond_kwargs=added).sample

    return call


# ---- the cut --------------------------------------------------------------------------------------------------------


def test_cut_of_sdxl_and_the_tiny_checkpoint(tiny_pt):
    """Branch 0 keeps the output of the last up block's second-to-last resnet: 320 channels for SDXL, 32 tiny."""
    from pipeline.device.nets.unet import UNet2DConditionModel, UNetConfig

    config = json.loads((REPO / "assets" / "sdxl_unet_config.json").read_text())
    sdxl = UNet2DConditionModel(UNetConfig.from_dict(config))
    where = deepcache.cut(sdxl)
    assert (where.last_up_block, where.feature_layer, where.has_attention) == ("up_blocks_2", "resnets_1", False)
    assert where.down_blocks == ("down_blocks_0", "down_blocks_1", "down_blocks_2")
    assert feature_shape(sdxl, 2, 128, 128) == (2, 128, 128, 320)  # 1024x1024 with CFG
    assert feature_shape(tiny_pt.networks.unet, 2, 8, 8) == (2, 8, 8, 32)  # 64x64 with CFG
    unet_params = tiny_pt.params["unet"]  # every name is a module of the parameters tree
    tiny = deepcache.cut(tiny_pt.networks.unet)
    assert tiny.feature_layer in unet_params[tiny.last_up_block]
    assert set(tiny.down_blocks + tiny.skipped_up_blocks) <= set(unet_params)


def test_full_is_the_plain_apply_and_shallow_on_its_feature_is_full(tiny_pt):
    """Bit for bit on this CPU: `unet_full` is the plain call plus a recorded output, and the shallow call fed the
    feature of the same inputs recomputes exactly the last layer and the head."""
    unet, params = tiny_pt.networks.unet, tiny_pt.params["unet"]
    inputs = _unet_inputs(2)
    full = jax.jit(functools.partial(deepcache.unet_full, unet))
    shallow = jax.jit(functools.partial(deepcache.unet_shallow, unet))
    expected = jax.jit(_plain(unet))(params, *inputs)
    noise, feature = full(params, *inputs)
    assert feature.shape == feature_shape(unet, 2, 8, 8)
    np.testing.assert_array_equal(np.asarray(noise), np.asarray(expected))
    np.testing.assert_array_equal(np.asarray(shallow(params, *inputs, feature)), np.asarray(expected))
    # Another step's feature gives another prediction (the feature is really read).
    _, other = full(params, *_unet_inputs(2, seed=1))
    assert not np.allclose(np.asarray(shallow(params, *inputs, other)), np.asarray(expected), atol=1e-3)


def test_shallow_reads_only_the_last_layer_conv_in_and_the_embeddings(tiny_pt):
    """Changing any weight DeepCache skips leaves the shallow call's output bit for bit; the ones it runs matter."""
    unet, params = tiny_pt.networks.unet, tiny_pt.params["unet"]
    where = deepcache.cut(unet)
    inputs = _unet_inputs(2)
    shallow = jax.jit(functools.partial(deepcache.unet_shallow, unet))
    _, feature = jax.jit(functools.partial(deepcache.unet_full, unet))(params, *inputs)
    base = np.asarray(shallow(params, *inputs, feature))

    def perturbed(*path):
        def bump(tree, keys):
            if not keys:
                return jax.tree_util.tree_map(lambda x: x + 0.5, tree)
            return {**tree, keys[0]: bump(tree[keys[0]], keys[1:])}

        return np.asarray(shallow(bump(params, path), *inputs, feature))

    last = f"resnets_{unet.config.layers_per_block}"  # the last up block's last layer (no attention in SDXL's)
    skipped = [(name,) for name in where.down_blocks + where.skipped_up_blocks + ("mid_block",)]
    skipped += [(where.last_up_block, layer) for layer in params[where.last_up_block] if layer != last]
    for path in skipped:
        np.testing.assert_array_equal(perturbed(*path), base, err_msg=str(path))
    for path in [(where.last_up_block, last), ("conv_in",), ("conv_out",), ("time_embedding",), ("add_embedding",)]:
        assert not np.allclose(perturbed(*path), base), path


def test_attention_hook_still_applies(tiny_pt):
    """The engine's attention hook (an interceptor too) replaces every attention core of the full call.

    Flax runs the most recently entered interceptor innermost: a counter entered before the hook sees every
    attention call, one entered after it sees only those the hook let through to the module's own core. Interceptors
    run while tracing, so tracing (`jax.eval_shape`) is enough; the engine's programs run under the hook and their
    pictures are checked against PyTorch below.
    """
    import flax.linen as nn

    from pipeline.device.attention import attention_hook
    from pipeline.device.nets.attention import Attention

    unet, params = tiny_pt.networks.unet, tiny_pt.params["unet"]
    inputs = _unet_inputs(2)
    calls = {}

    def counting(label):
        calls[label] = 0

        def interceptor(next_fun, args, kwargs, context):
            if context.method_name == "__call__" and isinstance(context.module, Attention):
                calls[label] += 1
            return next_fun(*args, **kwargs)

        return nn.intercept_methods(interceptor)

    def traced(label, call, *extra):
        def run(params, *inputs):
            with counting(f"{label} all"), attention_hook("xla"), counting(f"{label} not hooked"):
                return call(params, *inputs)

        return jax.eval_shape(run, params, *inputs, *extra)

    expected = traced("plain", _plain(unet))
    noise, feature = traced("full", functools.partial(deepcache.unet_full, unet))
    traced("shallow", functools.partial(deepcache.unet_shallow, unet), feature)
    assert noise.shape == expected.shape and feature.shape == feature_shape(unet, 2, 8, 8)
    assert calls["full all"] == calls["plain all"] > 0 and calls["full not hooked"] == calls["plain not hooked"] == 0
    # The tiny checkpoint's last up block, like SDXL's, has no attention: the shallow call runs none at all.
    assert calls["shallow all"] == 0


# ---- the host plan --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_is_what_pytorch_ran(name):
    """Per step, guidance (UNet batch 2) and the whole UNet (down block 0 ran) as PyTorch logged them."""
    case = CASES[name]
    plan = speed_plan(case["steps"], case["cfg_end"], case["deepcache"])
    assert [2 if step.cfg else 1 for step in plan.schedule] == case["unet_batch"]
    assert [step.full for step in plan.schedule] == case["full_unet"]


def test_plan_switches_and_halving():
    plan = speed_plan(8, 0.5, 3)
    assert [(s.cfg, s.full) for s in plan.schedule][3:6] == [(True, True), (False, False), (False, False)]
    assert [s.index for s in plan.schedule if s.drop_uncond] == [4]
    assert [s.index for s in plan.schedule if s.halve_feature] == [4]  # once: the kept feature is then halved
    # Guidance ends on a whole-UNet step: the new feature is already guidance-free.
    plan = speed_plan(8, 0.5, 2)
    assert [s.index for s in plan.schedule if s.drop_uncond] == [4] and not any(s.halve_feature for s in plan.schedule)
    # Levers off: every step guided and whole, nothing to halve; no CFG at all: nothing to drop.
    assert all(s.cfg and s.full and not (s.drop_uncond or s.halve_feature) for s in speed_plan(5).schedule)
    assert not any(s.cfg or s.drop_uncond for s in speed_plan(5, 0.4, 2, cfg=False).schedule)
    # A picture that starts part-way (img2img): its plan holds only the rows that run, and both levers count from
    # the first of them.
    plan = speed_plan(6, 0.5, 2)
    assert [s.index for s in plan.schedule] == list(range(6))
    assert [s.full for s in plan.schedule] == [True, False] * 3 and plan.guided_steps == 3
    assert sum(s.full for s in plan.schedule) == 3 and not all(s.cfg for s in plan.schedule)


def test_guided_steps_rounds_up_exactly():
    assert guided_steps(10, 0.3) == 3  # 0.3 * 10 = 3.0000000000000004 in floats
    assert [guided_steps(8, f) for f in (0.01, 0.125, 0.126, 0.5, 0.99, 1.0)] == [1, 1, 2, 4, 8, 8]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cfg_end": 0}, "cfg_end must be"),
        ({"cfg_end": 1.5}, "cfg_end must be"),
        ({"cfg_end": float("nan")}, "cfg_end must be"),
        ({"cfg_end": True}, "cfg_end must be"),
        ({"cfg_end": "0.5"}, "cfg_end must be"),
        ({"deepcache": 0}, "deepcache must be"),
        ({"deepcache": FIELD["deepcache"].high + 1}, "deepcache must be"),
        ({"deepcache": 2.5}, "deepcache must be"),
    ],
)
def test_bad_levers_are_one_sentence(kwargs, message):
    with pytest.raises(InvalidInput, match=message) as error:
        # a lever: its rule lives in the table once, and nothing below the request edge checks it again
        ((name, value),) = kwargs.items()
        FIELD[name].check(value)
    assert str(error.value).count(". ") == 0 and str(error.value).endswith(".")
    with pytest.raises(InvalidInput) as at_the_edge:  # the request edge gives the same sentence
        parse_request("a cat", **kwargs)
    assert str(at_the_edge.value) == str(error.value)


def test_a_server_without_levers_refuses_them_in_one_sentence():
    """--no-speed-levers: the programs are not compiled, so a request asking for either lever is refused at the edge
    (the default values pass)."""
    rules = RequestRules.of(EngineConfig(model="tiny", height=64, width=64, speed_levers=False))
    assert not rules.levers
    expected = (
        "This server runs every step whole and guided (started with --no-speed-levers): cfg_end and deepcache must "
        "be 1."
    )
    for levers in ({"cfg_end": 0.5}, {"deepcache": 2}, {"cfg_end": 0.5, "deepcache": 3}):
        with pytest.raises(InvalidInput) as error:
            parse_request("a cat", rules=rules, **levers)
        assert str(error.value) == expected
    request = parse_request("a cat", rules=rules, cfg_end=1, deepcache=1)
    assert (request.cfg_end, request.deepcache) == (1.0, 1)


# ---- the pictures, through the engine -------------------------------------------------------------------------------


def _request(engine, case, **changes):
    fields = {
        "negative_prompt": case["negative_prompt"] or "",
        "guidance_scale": case["guidance_scale"],
        "seed": case["seed"],
        "steps": case["steps"],
        "sampler": SAMPLERS[case["sampler"]],
        "cfg_end": case["cfg_end"],
        "deepcache": case["deepcache"],
        **changes,
    }
    return engine.request(case["prompt"], **fields)


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_pictures_equal_pytorch_with_the_levers(feature_engine, name):
    """The real engine (2 devices, step_full/step_shallow/halve_* programs) within 1 level of diffusers' PyTorch
    pipeline + callback + DeepCache, for image 0 (the case's seed); and the levers did change the picture."""
    case = CASES[name]
    np.testing.assert_array_equal(ARRAYS[f"{name}/noise"], _engine_noise(case["seed"]))  # the engine's noise
    before = feature_engine.compile_count
    result = feature_engine.generate(_request(feature_engine, case))
    got = np.asarray(result.images[0]).astype(np.int16)
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(got - expected).max() <= 1, name
    assert np.mean(got != expected) < 0.02, name
    plain = feature_engine.generate(_request(feature_engine, case, cfg_end=1, deepcache=1))
    assert np.mean(np.asarray(plain.images[0]) != expected) > 0.15, name  # far beyond what the tolerance lets through
    assert feature_engine.compile_count == before
    last = result.parameters[0].splitlines()[-1]
    assert ("CFG end: " in last) == (case["cfg_end"] != 1) and ("DeepCache: " in last) == (case["deepcache"] != 1)
    if case["cfg_end"] != 1:
        assert f"CFG end: {case['cfg_end']}" in last
    if case["deepcache"] != 1:
        assert f"DeepCache: {case['deepcache']}" in last


def _engine_noise(seed: int) -> np.ndarray:
    from pipeline.device.denoise import initial_latents

    return np.asarray(initial_latents(np.array([seed], np.uint32), 64, 64, 8))


def test_zero_compiles_over_every_combination(feature_engine):
    """cfg_end × deepcache × sampler × (no LoRA, a LoRA) × (no picture, a picture, a picture and a mask) on one
    generator: 96 requests, every one served by the programs compiled at start-up."""
    picture = FIXTURES / "image-input.png"
    inpaint = {"init_image": picture, "mask_image": FIXTURES / "image-mask.png", "strength": 1}
    pictures = ({}, {"init_image": picture, "strength": 0.75}, inpaint)
    loras = ([], [["kohya_sgm", 0.7]])
    before = feature_engine.compile_count
    seen = set()
    four = list(SAMPLER_NAMES)[:4]  # Euler, Euler a, DPM++ 2M (Karras): the others in test_a1111_samplers.py
    for cfg_end, interval, sampler, lora, inputs in itertools.product((1.0, 0.5), (1, 2), four, loras, pictures):
        request = feature_engine.request(
            "a red fox in fresh snow",
            seed=5,
            steps=4,
            sampler=sampler,
            cfg_end=cfg_end,
            deepcache=interval,
            loras=lora,
            **inputs,
        )
        result = feature_engine.generate(request)
        assert result.steps == (3 if inputs.get("strength") == 0.75 else 4)  # int(4 × 0.75) rows run
        seen.add(np.asarray(result.images[0]).tobytes())
    assert feature_engine.compile_count == before
    assert len(seen) == 96  # every setting changed the picture: none was silently ignored
