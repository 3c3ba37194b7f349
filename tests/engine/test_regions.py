"""Regional prompts (Regional Prompter's Attention mode): the divide syntax, the blend weights, the attention core,
and the engine against diffusers' PyTorch SDXL pipeline with the blend in its cross-attention processors
(scripts/make_region_fixtures.py)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.regions import parse_divide, parse_mask, parse_part_counts
from pipeline.contract.request import RequestRules, parse_request
from pipeline.host.planning.region_plan import attention_grids, blend_weights
from tests.conftest import FEATURE_DEVICES, FIXTURES, TEST_SIZE, TINY_PT, needs_chromium, served_programs_only

MANIFEST = json.loads((FIXTURES / "region-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "region-expected.npz")
CASES = {case["name"]: case for case in MANIFEST["cases"]}


@pytest.fixture(scope="module")
def region_engine():
    """tiny-pt on 2 devices at 64², regions of 2 and 3 parts; not warmed up: each test builds what it runs, and
    `served_programs_only` checks that it is served."""
    import jax

    from pipeline.generator import Generator

    return Generator.from_pretrained(
        str(TINY_PT),
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=4,
        dtype="float32",
        speed_levers=False,
        prompt_windows=1,
        previews=False,
        region_parts=(2, 3),
        devices=jax.devices()[:FEATURE_DEVICES],
    )


def _request(engine, case):
    return engine.request(
        case["prompt"],
        negative_prompt=case["negative_prompt"],
        seed=case["seed"],
        steps=case["steps"],
        guidance_scale=case["guidance_scale"],
        sampler="Euler",
        regions=case["regions"],
        region_base=case["region_base"],
    )


@pytest.mark.parametrize("name", ["columns_1_1", "columns_1_2_base0.3"])
def test_regions_match_diffusers_with_the_blend_in_its_processors(region_engine, name):
    case = CASES[name]
    with served_programs_only(region_engine):
        result = region_engine.generate(_request(region_engine, case))
    got = np.asarray(result.images[0], np.int16)
    assert np.abs(got - ARRAYS[name][0].astype(np.int16)).max() <= 2, name
    parameters = result.images[0].info["parameters"]
    assert 'RP Active: True, RP Divide mode: Columns, RP Ratios: "' in parameters
    assert f"RP Base Ratio: {case['region_base']:g}" in parameters


def test_one_part_is_the_plain_pipeline(region_engine):
    case = CASES["one_part"]
    assert np.abs(ARRAYS["one_part"].astype(np.int16) - ARRAYS["plain"]).max() <= 1  # the reference's own blend
    plan = region_engine.plan(_request(region_engine, case))
    assert plan.regions is None and plan.conditioning.windows == 1  # the plain programs run
    result = region_engine.generate(_request(region_engine, case))
    assert np.abs(np.asarray(result.images[0], np.int16) - ARRAYS["plain"][0]).max() <= 1


def test_bad_regions_are_refused_in_one_sentence(region_engine):
    refusals = {
        "Region ratios must be positive": dict(regions="columns 1,0"),
        "not Regional Prompter's divide syntax": dict(regions="diagonal 1,1"),
        "The prompt has 3 parts split on BREAK, but 2 regions need 2": dict(regions="columns 1,1"),
        "have 1, 2, 3 parts (--region-parts); this one has 4": dict(regions="columns 1,1,1", region_base=0.5),
        "leave deepcache, hires_scale and refiner_switch at 1": dict(regions="columns 1,1,1", deepcache=2),
    }
    rules = RequestRules(sizes=((TEST_SIZE, TEST_SIZE),), region_parts=(2, 3))
    for sentence, fields in refusals.items():
        with pytest.raises(InvalidInput) as caught:
            parse_request("a cat BREAK a dog BREAK a bird", rules=rules, **fields)
        assert sentence in str(caught.value), (fields, caught.value)
    long_part = " ".join(["cat"] * 80)
    with pytest.raises(InvalidInput, match="Part 2 of the regional prompt is longer than 75 tokens"):
        region_engine.plan(region_engine.request(f"a dog BREAK {long_part}", regions="columns 1,1"))
    mask = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(mask, format="PNG")
    with pytest.raises(InvalidInput, match="The region mask is 32×32 but the picture is 64×64"):
        region_engine.request("a cat", region_mask=mask.getvalue())


def test_a_painted_mask_is_its_colours_in_reading_order(region_engine):
    painted = np.zeros((64, 64, 3), np.uint8)
    painted[:, 32:] = (0, 0, 255)  # first met on row 0 at column 32
    painted[40:, :32] = (255, 0, 0)
    layout = parse_mask(Image.fromarray(painted), 64, 64)
    assert layout.count == 2 and layout.labels[0, 40] == 0 and layout.labels[50, 0] == 1 and layout.labels[0, 0] == -1
    buffer = io.BytesIO()
    Image.fromarray(painted).save(buffer, format="PNG")
    request = region_engine.request("sky BREAK a boat BREAK the sea", region_mask=buffer.getvalue(), region_base=0.2)
    weights = region_engine.plan(request).regions.weights[0].reshape(3, 8, 8)  # the latents' grid
    assert weights[0, 0, 0] == 1 and weights[:, 0, 0].sum() == pytest.approx(1)  # unpainted: the base alone
    assert weights[1, 0, 7] == pytest.approx(0.8) and weights[2, 7, 0] == pytest.approx(0.8)


def test_the_divide_syntax_and_the_blend_weights():
    assert parse_divide("rows 1,3").boxes == ((0.0, 0.0, 0.25, 1.0), (0.25, 0.0, 1.0, 1.0))
    nested = parse_divide("columns 1,1;1,2,1")  # Regional Prompter's: each group's first number its row's height
    assert nested.boxes == ((0.0, 0.0, 0.5, 1.0), (0.5, 0.0, 1.0, 2 / 3), (0.5, 2 / 3, 1.0, 1.0))
    weights = blend_weights(parse_divide("columns 1,2"), 0.3, 2, 3)  # base + 2 regions on a 2 x 3 grid
    assert weights.shape == (3, 6) and np.allclose(weights.sum(0), 1)
    assert np.allclose(weights[:, 0], [0.3, 0.7, 0]) and np.allclose(weights[:, 1], [0.3, 0, 0.7])
    assert attention_grids(96, 168, 3) == ((96, 168), (48, 84), (24, 42))
    assert (
        parse_part_counts("2-4") == (2, 3, 4) and parse_part_counts("1,3") == (3,) and parse_part_counts("none") == ()
    )
    with pytest.raises(InvalidInput, match="--region-parts takes counts from 1 to 8"):
        parse_part_counts("0-9")


def test_the_blend_of_identical_parts_is_plain_attention():
    import jax
    import jax.numpy as jnp

    from pipeline.device.attention import xla_attention
    from pipeline.device.regions import regional_attention

    q, k, v = (
        jax.random.normal(jax.random.PRNGKey(i), shape)
        for i, shape in enumerate([(2, 16, 2, 8), (2, 77, 2, 8), (2, 77, 2, 8)])
    )
    plain = xla_attention(q, k, v, 8**-0.5)
    weights = jax.random.uniform(jax.random.PRNGKey(5), (3, 16))
    weights = weights / weights.sum(0)
    blended = regional_attention(q, jnp.tile(k, (1, 3, 1, 1)), jnp.tile(v, (1, 3, 1, 1)), 8**-0.5, weights)
    assert np.abs(np.asarray(blended) - np.asarray(plain)).max() < 1e-5
    one = regional_attention(q, k, v, 8**-0.5, jnp.ones((1, 16)))
    assert np.abs(np.asarray(one) - np.asarray(plain)).max() < 1e-6


def test_the_cli_flags_and_the_written_parameters_read_back(region_engine, tmp_path):
    from pipeline.__main__ import build_parser, request_arguments
    from pipeline.config import engine_config
    from web.page.form import image_settings
    from web.page.png_info import read_form_values

    painted = np.zeros((TEST_SIZE, TEST_SIZE, 3), np.uint8)
    painted[:, TEST_SIZE // 2 :] = (0, 255, 0)
    Image.fromarray(painted).save(tmp_path / "regions.png")
    common = ["generate", "--model", str(TINY_PT), "--height", "64", "--width", "64", "--out", str(tmp_path)]
    args = build_parser().parse_args(
        [
            *common,
            "--prompt",
            "a sky BREAK a field",
            "--region-mask",
            str(tmp_path / "regions.png"),
            "--region-base",
            "0.4",
        ]
    )
    config = engine_config(args)
    assert config.region_parts == ()  # none compiled unless asked: each count is a UNet step per size and mode
    with pytest.raises(InvalidInput, match="compiles no regional prompts of several parts"):
        parse_request(**request_arguments(args), rules=RequestRules.of(config))
    served = engine_config(build_parser().parse_args([*common, "--prompt", "x", "--region-parts", "2-3"]))
    request = parse_request(**request_arguments(args), rules=RequestRules.of(served))
    assert served.region_parts == (2, 3) and request.region_layout().count == 1 and request.region_base == 0.4
    case = CASES["columns_1_2_base0.3"]
    result = region_engine.generate(_request(region_engine, case))
    path = result.save_pngs(tmp_path / "pngs")[0]
    settings, _ = image_settings(read_form_values(str(path)))
    assert settings["regions"] == "columns 1,2" and settings["region_base"] == 0.3


#: The status line holds a new answer (it differs from `before`: each answer rewrites it).
NEW_ANSWER = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && / images in /.test(text); }"""


@pytest.mark.browser
@needs_chromium
def test_the_page_draws_two_regions_compiling_nothing(region_engine, browser, tmp_path):
    """Issue 69, in Chromium: the Regions section's divide syntax, a prompt of two parts split on BREAK, Generate:
    the engine runs the regional step of 2 parts (compiled by the parity test above: the page adds no program) and
    the status line names the regions (and a history entry would: one renderer, `status_parts`). Then the syntax
    cleared and regions painted instead (a picture of two colours uploaded as the mask): the page sends the mask
    with the request, which runs on the same programs."""
    from conftest import ARTIFACTS, TIMEOUT_MS, open_advanced, open_section, served

    case = CASES["columns_1_1"]
    with served(region_engine) as app_page, served_programs_only(region_engine):
        tab = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(app_page.local_url, timeout=TIMEOUT_MS)
        tab.locator("#prompt textarea").fill(case["prompt"])
        open_advanced(tab)
        open_section(tab, "region-settings", "Regions", "#regions textarea")
        tab.locator("#regions textarea").fill("columns 1,1")
        before = tab.locator("#status").inner_text()
        tab.locator("#generate").click()
        tab.wait_for_function(NEW_ANSWER, arg=before, timeout=TIMEOUT_MS)
        status = tab.locator("#status").inner_text()
        painted = np.zeros((TEST_SIZE, TEST_SIZE, 3), np.uint8)
        painted[:, : TEST_SIZE // 2] = (255, 0, 0)
        painted[:, TEST_SIZE // 2 :] = (0, 255, 0)
        Image.fromarray(painted).save(tmp_path / "painted-regions.png")
        tab.locator("#regions textarea").fill("")
        tab.locator("#region-mask input[type=file]").set_input_files(str(tmp_path / "painted-regions.png"))
        tab.locator("#region-mask img").wait_for(timeout=TIMEOUT_MS)
        joins: list[str] = []
        tab.on("request", lambda r: "/queue/join" in r.url and joins.append(r.post_data or ""))
        before = tab.locator("#status").inner_text()
        tab.locator("#generate").click()
        tab.wait_for_function(NEW_ANSWER, arg=before, timeout=TIMEOUT_MS)
        from_mask = tab.locator("#status").inner_text()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "regions.png"), full_page=True)
        tab.close()
    assert "· regions columns 1,1" in status, status
    assert "painted-regions.png" in joins[0] and " images in " in from_mask, (joins, from_mask)
    assert not errors, errors
