"""ControlNet requests on the engine equal diffusers' PyTorch SDXL ControlNet pipelines (within 1 level of 255):
weight 0.8 over all steps, 1.2 over 0.25-0.75, two ControlNets at once, ControlNet + img2img; weight 0 gives the
pixels of no control exactly; nothing compiles per request; the images record A1111's ControlNet entries.

Fixtures: scripts/make_controlnet_fixtures.py (tests/fixtures/controlnet-*).
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from conftest import FIXTURES, TINY_PT
from PIL import Image

from pipeline.contract.controlnet_units import parse_controls, step_scales
from pipeline.contract.errors import InvalidInput
from pipeline.contract.parameters import parse_infotext
from pipeline.contract.parameters import read_control_entry as read_written
from pipeline.contract.request import Request

MANIFEST = json.loads((FIXTURES / "controlnet-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "controlnet-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}


def _units(case) -> list[dict]:
    return [
        {"name": name, "image": FIXTURES / image, "weight": weight, "start": start, "end": end}
        for name, image, weight, start, end in zip(
            case["controlnets"], case["maps"], case["weights"], case["starts"], case["ends"], strict=True
        )
    ]


def _request(engine, case, tmp_path, **fields):
    if case["pipeline"].endswith("Img2ImgPipeline"):
        picture = tmp_path / "init.png"
        Image.fromarray(np.load(FIXTURES / "image-expected.npz")["fit_image"]).save(picture)
        fields.update(init_image=picture, strength=case["strength"])
    return engine.request(
        case["prompt"],
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        sampler="Euler",
        controlnets=_units(case),
        **fields,
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_pixels_match_diffusers_controlnet_pipelines(control_engine, name, tmp_path):
    case = CASES[name]
    before = control_engine.compile_count
    result = control_engine.generate(_request(control_engine, case, tmp_path))
    assert control_engine.compile_count == before  # nothing compiles per request
    got = np.asarray(result.images[0], np.int16)  # [64, 64, 3]
    expected = ARRAYS[name][0].astype(np.int16)
    assert np.abs(got - expected).max() <= 1, name
    request = _request(control_engine, case, tmp_path)
    plain = control_engine.generate(Request(**{**request.__dict__, "controlnets": ()}))
    assert np.abs(np.asarray(plain.images[0], np.int16) - expected).max() > 8  # the control changes the picture
    written = parse_infotext(result.parameters[0]).settings  # what PNG Info reads back
    for i, name in enumerate(case["controlnets"]):
        entry = read_written(written[f"ControlNet {i}"])
        assert entry == {
            "module": "none",
            "name": name,
            "weight": pytest.approx(case["weights"][i]),
            "start": case["starts"][i],
            "end": case["ends"][i],
        }


def test_weight_zero_is_exactly_no_control(control_engine, tmp_path):
    case = {**CASES["weight0.8"], "weights": [0.0]}
    with_zero = control_engine.generate(_request(control_engine, case, tmp_path))
    request = _request(control_engine, case, tmp_path)
    without = control_engine.generate(Request(**{**request.__dict__, "controlnets": ()}))
    assert np.array_equal(np.asarray(with_zero.images[0]), np.asarray(without.images[0]))


def test_window_is_diffusers_controlnet_keep():
    from pipeline.contract.controlnet_units import ControlUnit

    window = ControlUnit("a", b"", weight=1.2, start=0.25, end=0.75)
    assert step_scales((window,), 4)[:, 0].tolist() == pytest.approx([0, 1.2, 1.2, 0])
    assert step_scales((ControlUnit("a", b"", 0.5), ControlUnit("b", b"", 1, 0.5, 1)), 2).tolist() == [
        [0.5, 0],
        [0.5, 1],
    ]


def test_request_travels_and_refusals_are_one_sentence(control_engine):
    request = control_engine.request(
        "a fox",
        controlnets=[
            {
                "name": "controlnet-b",
                "image": FIXTURES / MANIFEST["cases"][0]["maps"][0],
                "weight": 0.5,
                "preprocessor": "canny",
                "low": 50,
                "high": 120,
            }
        ],
    )
    assert Request.from_dict(json.loads(json.dumps(request.to_dict()))) == request
    unit = request.controlnets[0]
    assert unit.module == "canny" and set(np.unique(unit.pixels())) <= {0, 255}
    bad = [
        ({"name": "nope", "image": FIXTURES / "controlnet-map-a.png"}, "Unknown ControlNet"),
        ({"name": "controlnet-a"}, "needs a control image"),
        ({"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "weight": 3}, "weight must be"),
        ({"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "start": 0.8, "end": 0.2}, "below"),
        ({"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "preprocessor": "depth"}, "preprocessor"),
    ]
    for unit, words in bad:
        with pytest.raises(InvalidInput, match=words) as error:
            control_engine.request("a fox", controlnets=[unit])
        assert "\n" not in str(error.value)
    with pytest.raises(InvalidInput, match="At most 2"):
        control_engine.request(
            "a fox", controlnets=[{"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png"}] * 3
        )


def test_cli_flags_make_units(tmp_path):
    from pipeline.__main__ import build_parser, request_arguments
    from pipeline.config import engine_config
    from pipeline.contract.request import RequestRules, parse_request

    argv = [
        "generate",
        "--model",
        "tiny",
        "--controlnet",
        f"edges={FIXTURES / 'controlnet-a'}",
        "--controlnet",
        str(FIXTURES / "controlnet-b"),
        "--prompt",
        "a fox",
        "--out",
        str(tmp_path),
        "--control-image",
        str(FIXTURES / "controlnet-map-a.png"),
        "--control",
        "edges",
        "--control-weight",
        "0.7",
        "--control-image",
        str(FIXTURES / "image-input.png"),
        "--control",
        "controlnet-b",
        "--control-preprocessor",
        "none",
        "--control-preprocessor",
        "canny",
        "--control-end",
        "1",
        "--control-end",
        "0.5",
    ]  # the i-th of each flag goes with the i-th image
    args = build_parser().parse_args(argv)
    config = engine_config(args)
    assert config.controlnets == (f"edges={FIXTURES / 'controlnet-a'}", str(FIXTURES / "controlnet-b"))
    rules = RequestRules.of(config)
    assert rules.controlnets == ("edges", "controlnet-b")
    request = parse_request(**request_arguments(args), rules=rules)
    first, second = request.controlnets
    assert (first.name, first.weight, first.module, second.name, second.end, second.module) == (
        "edges",
        0.7,
        "none",
        "controlnet-b",
        0.5,
        "canny",
    )
    with pytest.raises(InvalidInput, match="--control-weight must be a number"):
        parse_request(**request_arguments(build_parser().parse_args([*argv, "--control-weight", "x"])), rules=rules)


def test_controlnet_units_one_takes_one_unit_and_compiles_one_unit_combinations(tmp_path):
    """--controlnet-units 1 (A1111's Multi-ControlNet unit count): a request with two units is one sentence, and only
    the one-unit combinations get a step program; 0 or 3 units is refused at start-up."""
    from pipeline.__main__ import build_parser, request_arguments
    from pipeline.config import engine_config
    from pipeline.contract.request import RequestRules, parse_request

    base = [
        "generate",
        "--model",
        "tiny",
        "--controlnet",
        str(FIXTURES / "controlnet-a"),
        "--prompt",
        "a fox",
        "--out",
        str(tmp_path),
    ]
    two = ["--control-image", str(FIXTURES / "controlnet-map-a.png")] * 2
    for units, accepted in ((None, 2), ("1", 1)):
        args = build_parser().parse_args(base + two + (["--controlnet-units", units] if units else []))
        config = engine_config(args)
        assert config.controlnet_units == accepted
        rules = RequestRules.of(config)
        if accepted == 2:
            assert len(parse_request(**request_arguments(args), rules=rules).controlnets) == 2
        else:
            with pytest.raises(InvalidInput, match=r"^At most 1 ControlNet per request on this server; got 2\.$"):
                parse_request(**request_arguments(args), rules=rules)
    from pipeline.checkpoint.controlnet_loading import load_controlnets
    from pipeline.checkpoint.loading import load_model
    from pipeline.host.planning.controlnet_plan import ServedControlNets

    loaded = load_model(str(TINY_PT), dtype="float32")
    nets = load_controlnets([str(FIXTURES / "controlnet-a"), str(FIXTURES / "controlnet-b")], "float32")
    assert ServedControlNets.of(nets, loaded).sets == ((0,), (0, 0))  # one architecture: one or two of it
    assert ServedControlNets.of(nets, loaded, units=1).sets == ((0,),)
    for bad in ("0", "3"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*base, "--controlnet-units", bad])


def test_a1111_controlnet_args_map_to_units():
    from pipeline.contract.controlnet_units import from_a1111

    image = base64.b64encode((FIXTURES / "controlnet-map-a.png").read_bytes()).decode()
    args = [
        {
            "enabled": True,
            "image": {"image": image},
            "module": "canny",
            "model": "controlnet-a [a1b2c3]",
            "weight": 0.6,
            "guidance_start": 0.1,
            "guidance_end": 0.9,
            "threshold_a": 64,
            "threshold_b": 128,
        },
        {"enabled": False, "image": image, "model": "controlnet-b"},
    ]
    [unit] = from_a1111(args)
    assert unit == {
        "name": "controlnet-a",
        "image": image,
        "weight": 0.6,
        "start": 0.1,
        "end": 0.9,
        "preprocessor": "canny",
        "low": 64,
        "high": 128,
    }
    [parsed] = parse_controls(from_a1111(args), ("controlnet-a",), 64, 64)
    assert (parsed.module, parsed.low, parsed.high, parsed.weight) == ("canny", 64, 128, 0.6)


def test_inpainting_runs_with_a_control(control_engine):
    """Inpainting (the 4-channel UNet's blend) with a ControlNet: no compile; the kept part stays, the rest changes."""
    before = control_engine.compile_count
    fields = {
        "seed": 4,
        "steps": 4,
        "init_image": FIXTURES / "image-input.png",
        "strength": 1.0,
        "mask_image": FIXTURES / "image-mask.png",
    }
    unit = {"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "weight": 1.5}
    with_control = np.asarray(
        control_engine.generate(control_engine.request("a fox", controlnets=[unit], **fields)).images[0], np.int16
    )
    without = np.asarray(control_engine.generate(control_engine.request("a fox", **fields)).images[0], np.int16)
    assert np.abs(with_control - without).max() > 8 and control_engine.compile_count == before


def test_a_control_with_a_lora_previews_and_stop(control_engine):
    """A ControlNet request with a LoRA: the LoRA still changes the picture (its merge feeds the controlled UNet),
    previews stream every 2 steps, Stop ends the request at the next step, and nothing compiles."""
    from pipeline.contract.stopping import StopFlag, Stopped

    before = control_engine.compile_count
    unit = {"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "weight": 1.2}
    seen = []
    with_lora = control_engine.generate(
        control_engine.request("a fox <lora:kohya_sgm:0.8>", seed=5, steps=4, controlnets=[unit]),
        on_preview=lambda done, total, pixels: seen.append((done, total, pixels)),
    )
    without = control_engine.generate(control_engine.request("a fox", seed=5, steps=4, controlnets=[unit]))
    assert np.abs(np.asarray(with_lora.images[0], np.int16) - np.asarray(without.images[0], np.int16)).max() > 8
    text = with_lora.parameters[0]
    assert "Lora hashes" in text and 'ControlNet 0: "Module: none, Model: controlnet-a, Weight: 1.2' in text
    assert [(done, total) for done, total, _ in seen] == [(2, 4)]
    assert seen[0][2].shape == (control_engine.num_images, 8, 8, 3) and seen[0][2].dtype == np.uint8
    stop = StopFlag()
    with pytest.raises(Stopped) as stopped:  # Stop pressed while step 1's result comes in
        control_engine.generate(
            control_engine.request("a fox <lora:kohya_sgm:0.8>", seed=5, steps=4, controlnets=[unit]),
            on_step=lambda done, total: stop.set() if done == 1 else None,
            should_stop=stop,
        )
    assert (stopped.value.done, stopped.value.total) == (2, 4)  # step 2 was queued already; step 3 never runs
    assert control_engine.compile_count == before


def test_an_engine_service_body_keeps_the_units_and_their_finished_maps(control_engine):
    """`Request.to_dict()` as an engine service reads it (`request_from_wire`): the units arrive whole, and a map a
    preprocessor made where the request entered is taken as it is (a canny map edged again would lose its lines)."""
    from pipeline.service.wire import request_from_wire

    units = [
        {
            "name": "controlnet-b",
            "image": FIXTURES / "image-input.png",
            "weight": 0.5,
            "preprocessor": "canny",
            "low": 50,
            "high": 120,
        },
        {"name": "controlnet-a", "image": FIXTURES / "controlnet-map-a.png", "end": 0.5},
    ]
    request = control_engine.request("a fox", seed=2, controlnets=units)
    assert request_from_wire(json.loads(json.dumps(request.to_dict())), control_engine.rules) == request
    picture = base64.b64encode((FIXTURES / "image-input.png").read_bytes()).decode()
    written = {"prompt": "a fox", "controlnets": [{"name": "controlnet-b", "image": picture, "preprocessor": "canny"}]}
    [unit] = request_from_wire(written, control_engine.rules).controlnets  # a hand-written body: the picture's edges
    assert unit.module == "canny" and set(np.unique(unit.pixels())) <= {0, 255}
    with pytest.raises(InvalidInput, match="preprocessor"):
        request_from_wire(
            {"prompt": "a fox", "controlnets": [{**request.to_dict()["controlnets"][0], "module": "x"}]},
            control_engine.rules,
        )
