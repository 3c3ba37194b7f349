"""ControlNet Union requests on the engine equal diffusers' PyTorch `StableDiffusionXLControlNetUnionPipeline` (within
2 levels of 255): one condition (canny), and two conditions in one forward (canny + tile); the types are traced (the
two-condition program serves any pair of types without compiling); a control_type is refused for a plain ControlNet,
an unknown one, and none for a union, in one sentence each.

Fixtures: scripts/make_controlnet_union_fixtures.py (tests/fixtures/controlnet-union*).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT, needs_chromium, served_programs_only
from PIL import Image

from pipeline.contract.controlnet_units import parse_controls
from pipeline.contract.errors import InvalidInput

MANIFEST = json.loads((FIXTURES / "controlnet-union-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "controlnet-union-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}
TYPES = {3: "canny", 6: "tile"}


@pytest.fixture(scope="module")
def union_engine(tmp_path_factory):
    """tiny-pt with the fixture union on 2 devices at 64x64, 3 steps; not warmed up (its tests build only the
    programs they run, inside `served_programs_only`)."""
    import jax

    from pipeline.generator import Generator

    return Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=3,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        previews=False,
        devices=jax.devices()[:FEATURE_DEVICES],
        controlnets=(str(FIXTURES / "controlnet-union"),),
    )


def _maps(tmp_path) -> dict:
    tile = tmp_path / "tile.png"
    Image.fromarray(np.load(FIXTURES / "image-expected.npz")["fit_image"]).save(tile)
    return {"map": FIXTURES / "controlnet-map-a.png", "tile": tile}


def _request(engine, case, tmp_path, types=None):
    maps = _maps(tmp_path)
    units = [
        {"image": maps[name], "weight": scale, "control_type": TYPES[mode]}
        for name, scale, mode in zip(case["maps"], case["scales"], types or case["control_modes"], strict=True)
    ]
    return engine.request(
        case["prompt"],
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        sampler="Euler",
        controlnets=units,
    )


@pytest.mark.parametrize("name", ["canny", "canny_tile"])
def test_pixels_match_diffusers_union_pipeline(union_engine, name, tmp_path):
    case = CASES[name]
    assert union_engine.rules.union_controlnets == ("controlnet-union",)
    with served_programs_only(union_engine):
        result = union_engine.generate(_request(union_engine, case, tmp_path))
    got = np.asarray(result.images[0], np.int16)  # [64, 64, 3]
    expected = ARRAYS[name][0].astype(np.int16)
    print(name, "max difference", np.abs(got - expected).max())
    assert np.abs(got - expected).max() <= 2, name
    if name == "canny_tile":  # other types, same program: traced values, nothing compiles
        before = union_engine.compile_count
        swapped = union_engine.generate(_request(union_engine, case, tmp_path, types=[6, 3]))
        assert union_engine.compile_count == before
        assert np.abs(np.asarray(swapped.images[0], np.int16) - got).max() > 0  # the types reach the network


def test_control_type_refusals(tmp_path):
    picture = FIXTURES / "controlnet-map-a.png"
    offered, unions = ("plain", "union"), ("union",)

    def refusal(item):
        with pytest.raises(InvalidInput) as raised:
            parse_controls([item], offered, TEST_SIZE, TEST_SIZE, unions=unions)
        return str(raised.value)

    assert refusal({"name": "union", "image": picture, "control_type": "sketchy"}).startswith(
        "Unknown control type 'sketchy'; choose one of: openpose, depth"
    )
    assert refusal({"name": "plain", "image": picture, "control_type": "canny"}) == (
        "ControlNet plain is not a union model: it takes no control_type ('canny')."
    )
    assert "is a union model: give each unit a control_type" in refusal({"name": "union", "image": picture})
    (unit,) = parse_controls(
        [{"name": "union", "image": picture, "control_type": "Normal Map"}], offered, 64, 64, unions=unions
    )
    assert unit.control_type == "normal"  # sd-webui-controlnet's name
    (unit,) = parse_controls(
        [{"name": "union", "image": picture, "preprocessor": "canny"}], offered, 64, 64, unions=unions
    )
    assert unit.control_type == "canny"  # canny's map says its type


def test_cli_a1111_and_parameters_carry_the_type():
    from argparse import Namespace

    from pipeline.__main__ import control_units
    from pipeline.contract.controlnet_units import from_a1111
    from pipeline.contract.parameters import control_entry, read_control_entry

    args = Namespace(control_image=["a.png", "b.png"], control_type=["canny", "tile"], control=["u", "u"])
    assert [unit["control_type"] for unit in control_units(args)] == ["canny", "tile"]
    sent = [{"image": "eA==", "model": "union [abc]", "union_control_type": "Hard Edge"}, {"image": "eA=="}]
    assert [unit.get("control_type") for unit in from_a1111(sent)] == ["Hard Edge", None]
    (unit,) = parse_controls(
        [{"name": "union", "image": FIXTURES / "controlnet-map-a.png", "control_type": "Hard Edge"}],
        ("union",),
        TEST_SIZE,
        TEST_SIZE,
        unions=("union",),
    )
    _, text = control_entry(unit, 0)
    assert text.endswith("Union Control Type: canny") and read_control_entry(text)["control_type"] == "canny"


def test_tile_preprocessor_is_a1111s_tile_resample():
    import cv2

    from pipeline.contract.controlnet_units import from_a1111, preprocess
    from pipeline.contract.parameters import control_entry, read_control_entry

    picture = np.asarray(Image.open(FIXTURES / "image-input.png").convert("RGB").resize((64, 48)))
    small = cv2.resize(picture, (32, 24), interpolation=cv2.INTER_AREA)
    expected = cv2.resize(small, (64, 48), interpolation=cv2.INTER_CUBIC)
    np.testing.assert_array_equal(preprocess(picture, "tile", rate=2.0), expected)
    np.testing.assert_array_equal(preprocess(picture, "tile", rate=1.0), picture)  # A1111: below 1.1, as it is
    (sent,) = from_a1111([{"image": "eA==", "module": "tile_resample", "threshold_a": 4.0}])
    assert (sent["preprocessor"], sent["rate"]) == ("tile", 4.0)
    (unit,) = parse_controls(
        [{"name": "union", "image": FIXTURES / "image-input.png", "preprocessor": "tile", "rate": 4}],
        ("union",),
        TEST_SIZE,
        TEST_SIZE,
        unions=("union",),
    )
    assert unit.control_type == "tile" and unit.rate == 4.0  # tile's map says its type
    assert read_control_entry(control_entry(unit, 0)[1])["rate"] == 4.0
    with pytest.raises(InvalidInput, match="tile down-sampling rate must be a number between 1 and 8"):
        parse_controls([{"name": "union", "image": FIXTURES / "image-input.png", "rate": 9}], ("union",), 64, 64)


#: The status line holds a new answer (it differs from `before`: each answer rewrites it).
NEW_ANSWER = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && / images? in /.test(text); }"""


@pytest.mark.browser
@needs_chromium
def test_the_page_sends_the_union_control_type_it_shows(union_engine, browser):
    """Issue 67, in Chromium: the ControlNet section offers the union's Control type (its only model is one), a map
    and the type "tile" chosen, Generate: the request the page sends carries the unit with that type, and the engine
    runs it on the union step the pictures above compiled (the type is data)."""
    import json

    from conftest import ARTIFACTS, TIMEOUT_MS, open_advanced, open_section, served

    with served(union_engine) as app_page, served_programs_only(union_engine):
        tab = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors, joins = [], []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.on("request", lambda r: "/queue/join" in r.url and joins.append(r.post_data or ""))
        tab.goto(app_page.local_url, timeout=TIMEOUT_MS)
        tab.locator("#prompt textarea").fill(CASES["canny"]["prompt"])
        open_advanced(tab)
        open_section(tab, "controlnet-settings", "ControlNet", "#control-image")
        tab.locator("#control-image input[type=file]").set_input_files(str(FIXTURES / "controlnet-map-a.png"))
        tab.locator("#control-map img").wait_for(state="visible", timeout=TIMEOUT_MS)
        tab.locator("#control-type input").click()
        tab.get_by_role("option", name="tile", exact=True).click()
        before = tab.locator("#status").inner_text()
        tab.locator("#generate").click()
        tab.wait_for_function(NEW_ANSWER, arg=before, timeout=TIMEOUT_MS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "controlnet-union.png"), full_page=True)
        tab.close()
    units = [
        unit
        for body in joins
        for value in json.loads(body).get("data", [])
        if isinstance(value, list)
        for unit in value
        if isinstance(unit, dict) and "control_type" in unit
    ]
    assert [unit["control_type"] for unit in units] == ["tile"], joins
    assert not errors, errors
