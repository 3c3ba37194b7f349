"""The request field `clip_skip` (diffusers' `clip_skip`; A1111's "Clip skip" numbered 2 more): the layer both text
encoders hand the UNet, picked by a traced index (device/text.skipped), so every value runs the served programs.
Pictures within 1 level of diffusers' PyTorch pipeline (tests/fixtures/clip-skip-expected.*, made by
scripts/make_prompt_fixtures.py); A1111's numbering in the `parameters` text."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import FIXTURES, generate

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD
from pipeline.contract.parameters import parse_infotext, written_settings
from pipeline.contract.request import RequestRules, parse_request

MANIFEST = json.loads((FIXTURES / "clip-skip-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "clip-skip-expected.npz")
RULES = RequestRules(sizes=((64, 64),))


@pytest.fixture(scope="module")
def tiny_pt():
    from pipeline.checkpoint.loading import load_model

    return load_model(str(FIXTURES / "tiny-pt"), dtype="float32", conversion_cache=False)


def test_a_traced_skip_selects_diffusers_layer():
    """hidden_states[-(k + 2)] for every k a model has; past its first layer, the embeddings' output (index 0)."""
    from pipeline.device.text import skipped

    states = tuple(jnp.full((1, 77, 4), float(i)) for i in range(4))  # the embeddings and 3 layers' outputs
    select = jax.jit(skipped)  # the index is an argument: one program for every value
    for k in range(4):
        assert float(select(states, jnp.int32(k))[0, 0, 0]) == max(2 - k, 0)  # states[-(k + 2)], else states[0]
        if k <= 2:  # a Python int (bench, direct callers): the same layer, indexed statically
            assert float(skipped(states, k)[0, 0, 0]) == 2 - k


def run_case(tiny_pt, case) -> np.ndarray:
    """The engine's prompt reading and encode/step/decode bodies on the fixture's latents, one window, uint8 as int."""
    from reference import run_local

    from pipeline.device.modules import Modules
    from pipeline.generator import text_widths
    from pipeline.host.planning.sampler_plan import SamplerConfig
    from pipeline.host.planning.tokens import ExtraRows, PromptReader, extra_capacity

    networks = tiny_pt.networks
    reader, extra = PromptReader((networks.tokenizer, networks.tokenizer_2), "original", {}), ExtraRows()
    negative = case["negative_prompt"] or ""
    text, neg = reader.read(case["prompt"], 1, extra), reader.read(negative, 1, extra)
    args = (
        np.ones((1, 2), np.int32),
        text.weights[None],
        neg.weights[None],
        *extra.tables(extra_capacity(1), text_widths(tiny_pt.params)),
        np.int32(case["clip_skip"]),
    )
    plan = SamplerConfig.from_scheduler_config(dict(networks.scheduler_config)).plan(MANIFEST["steps"], "euler")
    return run_local(
        Modules.of(networks),
        tiny_pt.params,
        text.ids[None],
        neg.ids[None],
        np.array([bool(negative)]),
        np.array([MANIFEST["guidance_scale"]], np.float32),
        ARRAYS["latents"],
        plan,
        text=args,
    )[0].astype(np.int16)


@pytest.mark.parametrize("name", [case["name"] for case in MANIFEST["cases"]])
def test_images_match_pytorch(tiny_pt, name):
    """clip_skip 1: within 1 level of diffusers' `clip_skip=1` (no negative prompt), and of both texts read at that
    layer by diffusers' `encode_prompt` (a negative prompt: A1111's and ComfyUI's reading)."""
    case = next(c for c in MANIFEST["cases"] if c["name"] == name)
    image = run_case(tiny_pt, case)
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(image - expected).max() <= 1, name
    assert np.mean(image != expected) < 0.02, name
    assert np.abs(run_case(tiny_pt, {**case, "clip_skip": 0}) - expected).mean() > 2  # the layer counts


def test_the_engine_skips_without_compiling(feature_engine):
    """Through the served programs: no compilation for any value; A1111's numbering in the `parameters` text, the
    status line's words; 0 writes nothing (as A1111 leaves out its default)."""
    before = feature_engine.compile_count
    plain = generate(feature_engine, "a red fox", seed=3, steps=2)
    skipped = generate(feature_engine, "a red fox", seed=3, steps=2, clip_skip=1)
    assert feature_engine.compile_count == before
    assert not np.array_equal(np.asarray(plain.images[0]), np.asarray(skipped.images[0]))
    assert "Clip skip" not in plain.parameters[0]
    assert parse_infotext(skipped.parameters[0]).settings["Clip skip"] == "3"
    request = feature_engine.request("a red fox", clip_skip=1)
    assert request.status_text() == " · clip skip 1" and request.to_dict()["clip_skip"] == 1


@pytest.mark.parametrize("value", [-1, 11, 1.5, True, "1", float("nan")])
def test_bad_values_are_one_sentence(value):
    with pytest.raises(
        InvalidInput,
        match=r"^clip_skip must be a whole number from 0 \(SDXL's penultimate layer\) "
        r"to 10; got .+\.$",
    ):
        parse_request("a cat", clip_skip=value, rules=RULES)


def test_a1111_numbering_both_ways():
    """Written: clip_skip k is "Clip skip: k + 2"; read: N is N - 2, and A1111's 1 (which SDXL reads at its own
    layer: A1111 applies its setting to SDXL only with `sdxl_clip_l_skip`) is 0. PNG Info and A1111's API read it
    so (tests/web/test_a1111_fields.py)."""
    row = FIELD["clip_skip"]
    assert [row.to_label(k) for k in (0, 1, 10)] == [2, 3, 12]
    assert [row.from_label(n) for n in (1, 2, 3, 12)] == [0, 0, 1, 10]
    request = parse_request("a cat", clip_skip=2, rules=RULES)
    assert written_settings(request.plain_values(), style=request.style, has_picture=False) == {"Clip skip": 4}
