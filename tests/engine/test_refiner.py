"""SDXL's refiner as a second stage: the engine's base + refiner equal diffusers' PyTorch
`StableDiffusionXLPipeline(denoising_end=s)` + `StableDiffusionXLImg2ImgPipeline(denoising_start=s)` within 1 level
of 255 (with and without guidance, a negative prompt, other aesthetic scores); a switch of 1 is the base alone; nothing
compiles per request; the images record A1111's `Refiner` entries; the refiner shares the base's text encoder 2 when
the weights file is the same; what cannot be a refiner, or a switch without one, is refused in one sentence.

Fixtures: scripts/make_refiner_fixtures.py (tests/fixtures/tiny-refiner, refiner-expected.*).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from conftest import FIXTURES, TINY_PT, TINY_REFINER

from pipeline.contract.errors import CheckpointError, InvalidInput
from pipeline.contract.request import RequestRules, parse_request
from web.page.png_info import parse_infotext

MANIFEST = json.loads((FIXTURES / "refiner-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "refiner-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}


def _request(engine, case, **fields):
    return engine.request(
        case["prompt"],
        negative_prompt=case["negative_prompt"] or "",
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        sampler="Euler",
        refiner_switch=case["refiner_switch"],
        aesthetic_score=case["aesthetic_score"],
        negative_aesthetic_score=case["negative_aesthetic_score"],
        **fields,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_pixels_match_diffusers_base_then_refiner(refiner_engine, name):
    case = CASES[name]
    before = refiner_engine.compile_count
    result = refiner_engine.generate(_request(refiner_engine, case))
    assert refiner_engine.compile_count == before  # nothing compiles per request
    got = np.asarray(result.images[0], np.int16)  # [64, 64, 3]
    expected = ARRAYS[name][0].astype(np.int16)
    assert np.abs(got - expected).max() <= 1, name
    written = parse_infotext(result.parameters[0]).settings  # what PNG Info reads back
    assert written["Refiner"] == "tiny-refiner"
    assert float(written["Refiner switch at"]) == case["refiner_switch"]


def test_switch_one_is_the_base_alone(refiner_engine):
    case = CASES["switch0.5_cfg"]
    base = refiner_engine.generate(_request(refiner_engine, {**case, "refiner_switch": 1.0}))
    assert "Refiner" not in parse_infotext(base.parameters[0]).settings
    refined = np.asarray(refiner_engine.generate(_request(refiner_engine, case)).images[0], np.int16)
    assert np.abs(np.asarray(base.images[0], np.int16) - refined).max() > 8  # the refiner changes the picture


def test_text_encoder_2_shared_when_the_same_file(caplog, tiny_dir):
    from pipeline.checkpoint.loading import load_model
    from pipeline.checkpoint.refiner_loading import load_refiner

    with caplog.at_level(logging.INFO, logger="pipeline.checkpoint.refiner_loading"):
        shared = load_refiner(str(TINY_REFINER), load_model(str(TINY_PT), dtype="float32"), dtype="float32")
        own = load_refiner(str(TINY_REFINER), load_model(str(tiny_dir), dtype="float32"), dtype="float32")
    assert shared.shared_text_encoder and "text_encoder_2" not in shared.params
    assert not own.shared_text_encoder and "text_encoder_2" in own.params
    assert not shared.zero_empty_negative  # the refiner's model_index.json: an empty negative is encoded as ""
    said = [record.getMessage() for record in caplog.records]
    assert any("shared with the base" in line for line in said) and any("its own" in line for line in said)


def test_refusals_are_one_sentence(tmp_path):
    from pipeline.checkpoint.loading import load_model
    from pipeline.checkpoint.refiner_loading import load_refiner

    with pytest.raises(InvalidInput, match="no refiner") as error:
        parse_request("a fox", refiner_switch=0.8, rules=RequestRules(sizes=((64, 64),)))
    assert "\n" not in str(error.value)
    with pytest.raises(InvalidInput, match="refiner_switch must be"):
        parse_request("a fox", refiner_switch=0, rules=RequestRules(sizes=((64, 64),), refiner="r"))
    base = load_model(str(TINY_PT), dtype="float32")
    for source, words in ((TINY_PT, "6 time ids"), (tmp_path, "model_index.json"), (tmp_path / "missing", "no folder")):
        with pytest.raises(CheckpointError, match=words) as error:
            load_refiner(str(source), base, dtype="float32")
        assert "\n" not in str(error.value) and str(error.value).startswith("Refiner ")


def test_cli_flags_and_a1111_fields_follow_the_table(tmp_path):
    from pipeline.__main__ import build_parser, request_arguments
    from pipeline.config import engine_config
    from web.apis.a1111_fields import a1111_request

    argv = [
        "generate",
        "--model",
        "tiny",
        "--refiner",
        str(TINY_REFINER),
        "--refiner-switch",
        "0.8",
        "--aesthetic-score",
        "7",
        "--prompt",
        "a fox",
        "--out",
        str(tmp_path),
    ]
    args = build_parser().parse_args(argv)
    rules = RequestRules.of(engine_config(args))
    assert engine_config(args).refiner == str(TINY_REFINER) and rules.refiner == "tiny-refiner"
    request = parse_request(**request_arguments(args), rules=rules)
    assert (request.refiner_switch, request.aesthetic_score, request.negative_aesthetic_score) == (0.8, 7.0, 2.5)
    rules = RequestRules(sizes=((64, 64),), refiner="tiny-refiner")
    given = a1111_request(
        {"prompt": "x", "refiner_checkpoint": "tiny-refiner [0123abcd]", "refiner_switch_at": 0.6}, rules, picture=False
    ).given
    assert given["refiner_switch"] == 0.6
    assert (
        a1111_request({"prompt": "x", "refiner_checkpoint": "tiny-refiner.safetensors"}, rules, picture=False).given[
            "refiner_switch"
        ]
        == 0.8
    )  # A1111's default switch
    for checkpoint in (None, "", "None"):  # no refiner named: none runs, whatever the switch says (as A1111)
        payload = {"prompt": "x", "refiner_checkpoint": checkpoint, "refiner_switch_at": 0.5}
        assert "refiner_switch" not in a1111_request(payload, rules, picture=False).given
    for rules_now, words in ((rules, "Unknown refiner_checkpoint"), (RequestRules(sizes=((64, 64),)), "no refiner")):
        with pytest.raises(InvalidInput, match=words):
            a1111_request({"prompt": "x", "refiner_checkpoint": "sd_xl_refiner_1.0"}, rules_now, picture=False)


def test_page_shows_the_refiner_controls_only_with_a_refiner():
    import gradio as gr

    from web.page.layout import table_controls

    with gr.Blocks():
        shown = table_controls("refiner", RequestRules(sizes=((64, 64),), refiner="tiny-refiner"))
        hidden = table_controls("refiner", RequestRules(sizes=((64, 64),)))
    assert set(shown) == {"refiner_switch", "aesthetic_score", "negative_aesthetic_score"}
    assert all(control.visible for control in shown.values()) and not any(c.visible for c in hidden.values())
    assert (shown["refiner_switch"].value, shown["aesthetic_score"].value) == (1.0, 6.0)


def test_a_picture_request_runs_the_refiner_too(refiner_engine):
    fields = {"seed": 3, "steps": 4, "init_image": FIXTURES / "image-input.png", "strength": 0.75}
    before = refiner_engine.compile_count
    refined = refiner_engine.generate(refiner_engine.request("a fox", refiner_switch=0.5, **fields))
    plain = refiner_engine.generate(refiner_engine.request("a fox", **fields))
    assert refiner_engine.compile_count == before
    assert parse_infotext(refined.parameters[0]).settings["Refiner"] == "tiny-refiner"
    assert np.abs(np.asarray(refined.images[0], np.int16) - np.asarray(plain.images[0], np.int16)).max() > 8


def test_the_switch_is_diffusers_denoising_end_and_the_refiner_restarts_a_multistep_history():
    from pipeline.host.compiling.programs import ProgramKey, program_keys
    from pipeline.host.planning.refiner_plan import base_steps, refiner_plan
    from pipeline.host.planning.sampler_plan import SamplerConfig

    config = SamplerConfig()  # SDXL base's: Euler, leading, steps_offset 1
    for case in CASES.values():  # the fixture's own record of diffusers' cut
        assert base_steps(config.plan(case["steps"], "euler"), case["refiner_switch"], 1000) == case["base_steps"]
    plan = config.plan(10, "dpmpp_2m")
    stages = refiner_plan(plan, 0.8, 1000, lambda k: config.plan(10, "dpmpp_2m", first=k))
    assert (stages.base_steps, stages.switch_row) == (8, 8)  # timesteps 901, 811, ..., 271 >= round(1000 - 800)
    assert np.array_equal(stages.plan.coefficients[:8], plan.coefficients[:8])  # the base's rows as they were
    assert stages.plan.coefficients[8][4] == 0 and plan.coefficients[8][4] != 0  # D_prev folded: a fresh history
    assert np.array_equal(stages.plan.coefficients[9], plan.coefficients[9])  # then the sampler's own rows
    assert refiner_plan(plan, 1.0, 1000, None).switch_row == plan.rows  # 1 = off
    keys = program_keys([(64, 64)], cfg=True, levers=True, refiner=True)
    assert {
        ProgramKey("refiner_encode", cfg=True),
        ProgramKey("refiner_step", 64, 64, True),
        ProgramKey("refiner_step", 64, 64, False),
    } <= set(keys)


def test_png_info_fills_the_switch_only_where_there_is_a_refiner():
    from web.page.form import Form

    def form(refiner):
        return Form(controls={"refiner_switch": object()}, lora_rows=(), styles=(), sizes=(), loras=(), refiner=refiner)

    updates, notes = form("tiny-refiner").fill({"refiner_switch": 0.8})
    assert updates == [{"__type__": "update", "value": 0.8}] and not notes
    updates, notes = form("").fill({"refiner_switch": 0.8})  # Generate would refuse it here
    assert "value" not in updates[0] and notes == ["This server has no refiner, so Refiner switch at 0.8 was left out."]
