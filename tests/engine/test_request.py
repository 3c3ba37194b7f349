"""The one request contract (pipeline/contract/request.py): `parse_request` checks every field where a request enters
and returns the `Request` the engine runs as it is; followers rebuild it from data."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import FIXTURES

from pipeline.config import EngineConfig
from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD, FIELDS, PLAIN
from pipeline.contract.hires import UPSCALERS
from pipeline.contract.request import Request, RequestRules, parse_request, request_schema
from web.page.prompt_filter import PromptFilter


def test_parse_request_defaults_and_style():
    request = parse_request("  a {cat}\n on a mat ", "blurry", style="Cinematic", guidance_scale=7, seed=3.0)
    assert isinstance(request, Request)
    assert request.prompt == "a {cat} on a mat"
    assert request.negative_prompt == "blurry"
    assert request.style == "Cinematic"
    assert request.guidance_scale == 7.0 and isinstance(request.guidance_scale, float)
    assert request.seed == 3
    assert request.styled_prompt.startswith("cinematic still a {cat} on a mat . emotional")
    assert request.styled_negative_prompt.startswith("anime, cartoon")
    assert request.styled_negative_prompt.endswith(", blurry")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seed = 4  # type: ignore[misc]

    plain = parse_request("a dog")
    assert (plain.prompt, plain.negative_prompt, plain.style, plain.guidance_scale, plain.seed) == (
        "a dog",
        "",
        "No style",
        5.0,
        0,
    )
    assert (plain.styled_prompt, plain.styled_negative_prompt) == ("a dog", "")


@pytest.mark.parametrize("prompt", ["", "   ", None, "\x00\u200b\n"])
def test_parse_request_empty_prompt(prompt):
    with pytest.raises(InvalidInput) as info:
        parse_request(prompt)
    assert str(info.value) == "Please enter a prompt."


def test_parse_request_randomize_and_errors():
    request = parse_request("a dog", seed="not a number", randomize_seed=True)
    assert 0 <= request.seed <= FIELD["seed"].high
    with pytest.raises(InvalidInput, match="^Guidance scale"):
        parse_request("a dog", guidance_scale=99)
    with pytest.raises(InvalidInput, match="^Unknown style"):
        parse_request("a dog", style="Nope")
    with pytest.raises(InvalidInput, match="^Negative prompt is too long"):
        parse_request("a dog", negative_prompt="n" * 2001)
    with pytest.raises(InvalidInput, match="^Seed must be"):
        parse_request("a dog", seed=-5)


def test_parse_request_uses_filter_on_prompt_only():
    check = PromptFilter(["spam"]).check
    with pytest.raises(InvalidInput) as info:
        parse_request("Lovely SPAM, wonderful spam", check_prompt=check)
    assert str(info.value) == "This prompt contains a blocked word; please rephrase it."
    request = parse_request("a tin can", negative_prompt="spam", check_prompt=check)
    assert request.negative_prompt == "spam"
    # zero-width characters are removed before the filter runs, so they cannot split a word to dodge it
    with pytest.raises(InvalidInput):
        parse_request("sp\u200bam", check_prompt=check)


def test_rules_give_the_defaults_and_the_compiled_sizes():
    """What a request leaves out comes from the server's rules; size, steps and sampler are checked against them."""
    config = EngineConfig(
        model="tiny", height=64, width=64, sizes=((64, 64), (128, 224)), steps=7, sampler="dpmpp_2m", guidance_scale=3.5
    )
    rules = RequestRules.of(config)
    assert (rules.sizes, rules.steps, rules.sampler, rules.guidance_scale) == (
        ((64, 64), (128, 224)),
        7,
        "DPM++ 2M",
        3.5,
    )
    request = parse_request("a cat", rules=rules)
    assert (request.size, request.steps, request.sampler, request.guidance_scale) == ((64, 64), 7, "DPM++ 2M", 3.5)
    other = parse_request("a cat", size="224×128 (16:9)", steps=30.0, sampler="euler a", rules=rules)
    assert (other.size, other.steps, other.sampler) == ((128, 224), 30, "Euler a")
    assert parse_request("a cat", size=(128, 224), rules=rules).size == (128, 224)
    with pytest.raises(InvalidInput, match=r"^This server compiled 64×64 or 224×128 only; got 512×512\.$"):
        parse_request("a cat", size=(512, 512), rules=rules)
    with pytest.raises(InvalidInput, match=r"^Steps must be a whole number from 1 to 100; got 0\.$"):
        parse_request("a cat", steps=0, rules=rules)
    with pytest.raises(InvalidInput, match=r"^Unknown sampler 'DPM2'; choose one of: Euler, Euler a, DPM\+\+ 2M"):
        parse_request("a cat", sampler="DPM2", rules=rules)


def test_guidance_free_rules_drop_the_negative_prompt_and_guidance():
    rules = RequestRules(sizes=((64, 64),), cfg=False)
    request = parse_request("a cat", "blurry", style="Cinematic", guidance_scale=9, rules=rules)
    assert (request.negative_prompt, request.styled_negative_prompt, request.guidance_scale) == ("", "", 0.0)
    assert request.styled_prompt.startswith("cinematic still a cat")


def test_a_request_travels_as_json_data_and_comes_back_equal():
    """On several processes the leader publishes `to_dict()`; each follower rebuilds the same request."""
    request = parse_request(
        "a lighthouse",
        "fog",
        style="Anime",
        guidance_scale=6.5,
        seed=1234,
        steps=9,
        sampler="Euler a",
        size=(1024, 1024),
    )
    assert Request.from_dict(json.loads(json.dumps(request.to_dict()))) == request


def test_the_second_pass_travels_to_the_followers_whole():
    """Two processes = one for the refiner and the hires fix: every second-pass field the leader checked reaches a
    follower (`to_dict()` -> JSON -> `from_dict()`), an ESRGAN model's name included, and the engine service's
    reader (`request_from_wire`) takes the same data back to an equal request."""
    from pipeline.service.wire import request_from_wire

    rules = RequestRules(
        sizes=((64, 64),), refiner="tiny-refiner", hires_scales=(1.5, 2.0), hires_upscalers=(*UPSCALERS, "4x-Tiny")
    )
    request = parse_request(
        "a lighthouse",
        "fog",
        seed=7,
        steps=6,
        refiner_switch=0.7,
        aesthetic_score=7.0,
        negative_aesthetic_score=2.0,
        hires_scale=1.5,
        hires_steps=3,
        hires_denoise=0.4,
        hires_upscaler="4x-Tiny",
        rules=rules,
    )
    sent = json.loads(json.dumps(request.to_dict()))
    assert Request.from_dict(sent) == request
    assert request_from_wire(sent, rules) == request
    second = {
        name: sent[name]
        for name in (
            "refiner_switch",
            "aesthetic_score",
            "negative_aesthetic_score",
            "hires_scale",
            "hires_steps",
            "hires_denoise",
            "hires_upscaler",
        )
    }
    assert second == {
        "refiner_switch": 0.7,
        "aesthetic_score": 7.0,
        "negative_aesthetic_score": 2.0,
        "hires_scale": 1.5,
        "hires_steps": 3,
        "hires_denoise": 0.4,
        "hires_upscaler": "4x-Tiny",
    }


def test_the_schema_describes_the_wire_format_with_the_tables_bounds():
    """`request_schema()` names every key `to_dict()` writes; a plain field's bounds are the table's."""
    request = parse_request("a lighthouse", steps=9, cfg_end=0.5, deepcache=2, rules=RequestRules(sizes=((64, 64),)))
    data, schema = request.to_dict(), request_schema()
    assert set(schema["properties"]) == set(data) and schema["required"] == ["prompt"]
    assert json.loads(json.dumps(schema)) == schema
    for row in PLAIN:
        described = schema["properties"][row.name]
        if row.kind == "choice":
            assert row.choices == tuple(described.get("anyOf", [described])[0]["enum"])
            continue
        if row.kind == "factors":  # "b1,b2,s1,s2" or "" (off)
            assert described["type"] == "string" and data[row.name] == ""
            continue
        lowest = described.get("exclusiveMinimum", described.get("minimum"))
        assert described["maximum"] == row.high and lowest == row.low
        value = data[row.name]
        assert (row.low < value if row.above else row.low <= value) and value <= row.high


def test_every_request_field_with_a_flag_is_a_flag_of_generate():
    """The CLI's request flags are the table's: each row with a flag, with its default."""
    from pipeline.__main__ import build_parser

    parser = build_parser()
    generate = next(action for action in parser._actions if action.dest == "command").choices["generate"]
    flags = {flag: action for action in generate._actions for flag in action.option_strings}
    for row in FIELDS:
        if row.flag:
            assert row.flag in flags, row.flag
    assert flags["--deepcache"].default == FIELD["deepcache"].default and flags["--deepcache"].type is int


def test_a_follower_decodes_the_picture_it_receives_to_the_leaders_arrays():
    """The leader keeps the arrays it fitted; a follower decodes the PNGs it receives, once, to the same arrays."""
    rules = RequestRules(sizes=((64, 64),), steps=8)
    request = parse_request(
        "a cabin",
        init_image=FIXTURES / "image-input.png",
        mask_image=FIXTURES / "image-mask.png",
        strength=0.6,
        rules=rules,
    )
    rebuilt = Request.from_dict(json.loads(json.dumps(request.to_dict())))
    assert rebuilt == request and rebuilt.decoded is None
    here, there = request.picture(), rebuilt.picture()
    assert there is rebuilt.picture()  # decoded once
    assert here.steps_run == there.steps_run == 4  # int(8 × 0.6)
    for name in ("pixels", "repaint", "repaint_latents"):
        assert np.array_equal(getattr(here, name), getattr(there, name)), name
