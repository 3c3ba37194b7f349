"""FreeU and perturbed-attention guidance (issue 67, parts 2-3): diffusers' Fourier filter, the per-row plan, the
one-sentence refusals, Forge's alwayson scripts, and the engine's pictures against diffusers' PyTorch pipelines
(tests/fixtures/freeu-pag-expected.*, scripts/make_freeu_pag_fixtures.py; no request compiles)."""

from __future__ import annotations

import json

import httpx
import jax
import numpy as np
import pytest
from conftest import FIXTURES, TEST_SIZE, TINY_PT, needs_chromium, served, served_programs_only
from gradio_client import Client

from pipeline.contract import image_files
from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD
from pipeline.contract.parameters import parse_infotext
from pipeline.contract.request import RequestRules, parse_request
from pipeline.device.freeu import fourier_filter
from pipeline.host.planning.extras_plan import extras_plan
from pipeline.host.planning.sampler_plan import COEFFICIENTS
from web.apis.a1111_fields import a1111_request

OFFERED = RequestRules(sizes=((64, 64),), pag=True, freeu=True)
#: diffusers' pictures with FreeU and PAG (scripts/make_freeu_pag_fixtures.py), from the engine's noise.
MANIFEST = json.loads((FIXTURES / "freeu-pag-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "freeu-pag-expected.npz")
#: The fixture's `freeu_pag` case (diffusers' PAG pipeline after `enable_freeu`) is checked by hand, not here: its
#: program (ProgramKey.extras ("freeu", "pag")) is one more compile, 9 CPU-s in this test (over CI's budget for it);
#: measured 2026-12-06: within 1 level of diffusers (7 from `freeu`, 33 from `pag_cfg`).
BY_HAND = ("freeu_pag",)
CASES = {case["name"]: case for case in MANIFEST["cases"] if case["name"] not in BY_HAND}


def diffusers_fourier_filter(x: np.ndarray, threshold: int, scale: float) -> np.ndarray:
    """diffusers' `utils/torch_utils.fourier_filter`, line for line with NumPy's FFT for torch's, on NCHW."""
    x_freq = np.fft.fftshift(np.fft.fftn(x, axes=(-2, -1)), axes=(-2, -1))
    batch, channels, height, width = x_freq.shape
    mask = np.ones((batch, channels, height, width))
    crow, ccol = height // 2, width // 2
    mask[..., crow - threshold : crow + threshold, ccol - threshold : ccol + threshold] = scale
    x_freq = np.fft.ifftshift(x_freq * mask, axes=(-2, -1))
    return np.fft.ifftn(x_freq, axes=(-2, -1)).real.astype(x.dtype)


@pytest.mark.parametrize("shape", [(2, 3, 2, 2), (2, 3, 4, 4), (1, 2, 6, 5), (1, 2, 16, 16)])
def test_fourier_filter_is_diffusers(shape):
    """The engine's NHWC filter, a scale per row, equals diffusers' NCHW one row by row (even, odd and tiny sizes)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    scales = np.asarray([0.2, 0.9][: shape[0]], np.float32)
    got = np.asarray(jax.jit(fourier_filter)(np.transpose(x, (0, 2, 3, 1)), scales)).transpose(0, 3, 1, 2)
    for row, scale in enumerate(scales):
        expected = diffusers_fourier_filter(x[row : row + 1], 1, float(scale))
        np.testing.assert_allclose(got[row : row + 1], expected, atol=2e-6)


def test_the_plan_holds_diffusers_adaptive_pag_scale_per_row():
    """pag_scale − pag_adaptive_scale × (1000 − t), not below 0, at each row's timestep; FreeU's factors on every
    row; neither asked: no extras (today's programs)."""

    class Plan:  # the rows' timesteps are all the plan stage reads
        coefficients = np.zeros((4, len(COEFFICIENTS)), np.float32)

    Plan.coefficients[:, 0] = [999.0, 751.0, 501.0, 1.0]
    request = parse_request("a cat", rules=OFFERED, pag_scale=3.0, pag_adaptive_scale=0.01, freeu="1.3, 1.4,0.9,0.2")
    extras = extras_plan(request, Plan)
    assert extras.kinds == ("freeu", "pag")
    np.testing.assert_allclose(extras.rows[:, 4], [2.99, 0.51, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(extras.rows[:, :4], [[1.3, 1.4, 0.9, 0.2]] * 4, atol=1e-6)
    assert request.freeu == "1.3,1.4,0.9,0.2"
    assert extras_plan(parse_request("a cat", rules=OFFERED), Plan) is None


@pytest.mark.parametrize(
    ("fields", "rules", "message"),
    [
        ({"pag_scale": -1}, OFFERED, "pag_scale must be a number between 0 (off) and 10; got -1."),
        (
            {"freeu": "1.3,1.4,0.9"},
            OFFERED,
            "freeu must be empty (off) or 4 numbers from 0 to 10 separated by commas; got '1.3,1.4,0.9'.",
        ),
        ({"freeu": "a,b,c,d"}, OFFERED, "freeu must be empty (off) or 4 numbers from 0 to 10 separated by commas; "),
        ({"pag_scale": 2}, RequestRules(sizes=((64, 64),)), "This server does not offer PAG (start it with --pag)"),
        (
            {"freeu": "1,1,1,1"},
            RequestRules(sizes=((64, 64),)),
            "does not offer FreeU (start it with --freeu-programs)",
        ),
        (
            {"pag_scale": 2, "deepcache": 2},
            OFFERED,
            "DeepCache does not combine with FreeU or PAG: set deepcache to 1.",
        ),
    ],
)
def test_bad_input_is_one_sentence(fields, rules, message):
    with pytest.raises(InvalidInput) as error:
        parse_request("a cat", rules=rules, **fields)
    assert message in str(error.value)
    assert str(error.value).count(". ") == 0


def test_forge_clients_alwayson_scripts_set_freeu_and_pag():
    """Forge's built-in scripts by their titles and `ui()` values; a disabled one sets nothing; Forge's step window
    or attenuation, which the engine does not run, is refused in one sentence."""
    payload = {
        "prompt": "a cat",
        "alwayson_scripts": {
            "FreeU Integrated (SD 1.x, SD 2.x, SDXL)": {"args": [True, 1.3, 1.4, 0.9, 0.2, 0, 1]},
            "PerturbedAttentionGuidance Integrated": {"args": [True, 3, 0, 0, 1]},
            "Never OOM Integrated": {"args": [False, False]},
        },
    }
    made = a1111_request(payload, OFFERED, picture=False)
    assert (made.given["freeu"], made.given["pag_scale"]) == ("1.3,1.4,0.9,0.2", 3.0)
    assert made.ignored_scripts == ("Never OOM Integrated",)
    off = {"prompt": "a cat", "alwayson_scripts": {"PerturbedAttentionGuidance Integrated": {"args": [False, 3]}}}
    assert "pag_scale" not in a1111_request(off, OFFERED, picture=False).given
    attenuated = {"prompt": "a", "alwayson_scripts": {"PerturbedAttentionGuidance Integrated": {"args": [True, 3, 5]}}}
    with pytest.raises(InvalidInput, match="leave Forge's attenuation at 0"):
        a1111_request(attenuated, OFFERED, picture=False)


@pytest.fixture(scope="module")
def extras_engine():
    """tiny-pt (the references' checkpoint) on one device with --pag and --freeu-programs, no levers, one window, no
    previews: it compiles, on first use, only the programs its tests run (the plain step, FreeU's, PAG's)."""
    from pipeline.generator import Generator

    return Generator.from_pretrained(
        str(TINY_PT),
        devices=jax.devices()[:1],
        height=TEST_SIZE,
        width=TEST_SIZE,
        steps=2,
        dtype="float32",
        prompt_windows=1,
        previews=False,
        speed_levers=False,
        pag=True,
        freeu_programs=True,
    )


def _fields(case: dict) -> dict:
    """The request fields of a reference case (scripts/make_freeu_pag_fixtures.py)."""
    fields = {
        "negative_prompt": case["negative_prompt"] or "",
        "guidance_scale": case["guidance_scale"],
        "seed": case["seed"],
        "steps": case["steps"],
        "sampler": "Euler",
    }
    if case["freeu"]:
        fields["freeu"] = ",".join(f"{MANIFEST['freeu'][name]:g}" for name in ("b1", "b2", "s1", "s2"))
    if case["pag_scale"]:
        fields.update(pag_scale=case["pag_scale"], pag_adaptive_scale=case["pag_adaptive_scale"])
    return fields


@pytest.mark.parametrize("name", sorted(CASES))
def test_engine_pictures_equal_diffusers(extras_engine, name):
    """The engine within 2 levels of diffusers' PyTorch pipelines: `enable_freeu` on the base, the SDXL PAG pipeline
    on the middle block with CFG and without (the latter with the adaptive scale, through the guided program at
    guidance 1, as a server without levers runs it); with both off, today's picture within 1 level. Each feature
    changes the picture beyond that; the `parameters` text names it; nothing unserved compiles."""
    case = CASES[name]
    np.testing.assert_array_equal(ARRAYS[f"{name}/noise"], _engine_noise(case["seed"]))
    with served_programs_only(extras_engine):
        result = extras_engine.generate(extras_engine.request(case["prompt"], **_fields(case)))
    got = np.asarray(result.images[0]).astype(np.int16)
    expected = np.round(ARRAYS[name][0] * 255)
    assert np.abs(got - expected).max() <= (1 if name == "plain" else 2), name
    plain = np.round(ARRAYS["plain"][0] * 255)
    assert name == "plain" or np.abs(got - plain).max() > 4, name  # the feature acted
    settings = parse_infotext(result.parameters[0]).settings
    assert settings.get("FreeU") == _fields(case).get("freeu")
    assert settings.get("PAG scale") == (f"{case['pag_scale']:g}" if case["pag_scale"] else None)


def _engine_noise(seed: int) -> np.ndarray:
    from pipeline.device.denoise import initial_latents

    return np.asarray(initial_latents(np.array([seed], np.uint32), TEST_SIZE, TEST_SIZE, 8))


def test_the_page_offers_them_and_its_api_reaches_the_engine(extras_engine, tmp_path):
    """The page around the engine shows PAG's and FreeU's controls (what /config serves: visible, as the server
    compiled their programs); a gradio_client call with each runs only served programs (those the pictures above
    ran), its PNG's `parameters` name it, and PNG Info fills the form back with it."""
    with served(extras_engine) as page:
        config = httpx.get(page.local_url.rstrip("/") + "/config").json()
        shown = {c["props"].get("elem_id"): c["props"].get("visible") for c in config["components"]}
        assert [shown.get(name) for name in ("pag-scale", "pag-adaptive-scale", "freeu")] == [True] * 3
        client = Client(page.local_url, verbose=False, download_files=str(tmp_path))
        for (name, value), label, written in (
            (("pag_scale", 3.0), "PAG scale", "3"),
            (("freeu", "1.3,1.4,0.9,0.2"), "FreeU", "1.3,1.4,0.9,0.2"),
        ):
            with served_programs_only(extras_engine):
                gallery, _, status = client.predict(
                    "a lighthouse", seed=7, randomize_seed=False, steps=2, api_name="/generate_png", **{name: value}
                )
            picture = gallery[0]["image"]
            assert parse_infotext(image_files.read_parameters(picture)).settings[label] == written
            assert f"{FIELD[name].status} {written}" in status, status
            filled = dict(zip(page.form.fields, page.form.from_image(picture), strict=False))
            assert filled[page.form.controls[name]]["value"] == value


def test_png_info_fills_pag_and_freeu_only_where_they_are_offered():
    """An image's PAG and FreeU go to the form on a server with their programs; elsewhere they stay as they are (the
    controls are hidden, Generate would refuse them), with one sentence each."""
    from web.page.form import Form

    def form(*extras):
        shown = {name: object() for name in ("pag_scale", "pag_adaptive_scale", "freeu")}
        return Form(controls=shown, lora_rows=(), styles=(), sizes=(), loras=(), extras=extras)

    settings = {"pag_scale": 3.0, "pag_adaptive_scale": 0.0, "freeu": "1.3,1.4,0.9,0.2"}
    updates, notes = form("freeu", "pag").fill(settings)
    assert [update["value"] for update in updates] == [3.0, 0.0, "1.3,1.4,0.9,0.2"] and not notes
    updates, notes = form().fill(settings)
    assert not any("value" in update for update in updates)
    assert notes == [
        "This server does not offer PAG, so PAG scale 3 was left out.",
        "This server does not offer FreeU, so FreeU 1.3,1.4,0.9,0.2 was left out.",
    ]


#: The status line holds a new answer (it differs from `before`: each answer rewrites it).
NEW_ANSWER = """(before) => { const text = document.querySelector('#status').innerText;
    return text !== before && / images? in /.test(text); }"""


@pytest.mark.browser
@needs_chromium
def test_the_pages_pag_and_freeu_controls_reach_the_engine(extras_engine, browser):
    """Issue 67, in Chromium: the PAG scale slider, then the FreeU factors box, each with Generate: the status line
    names the one the engine ran (the programs the pictures above compiled: the page adds none)."""
    from conftest import ARTIFACTS, TIMEOUT_MS, open_advanced, set_slider

    def generate(tab) -> str:
        before = tab.locator("#status").inner_text()
        tab.locator("#generate").click()
        tab.wait_for_function(NEW_ANSWER, arg=before, timeout=TIMEOUT_MS)
        return tab.locator("#status").inner_text()

    with served(extras_engine) as app_page, served_programs_only(extras_engine):
        tab = browser.new_page(viewport={"width": 1280, "height": 1100})
        errors = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(app_page.local_url, timeout=TIMEOUT_MS)
        tab.locator("#prompt textarea").fill("a lighthouse")
        open_advanced(tab)
        set_slider(tab, "pag-scale", 3)
        with_pag = generate(tab)
        set_slider(tab, "pag-scale", 0)
        tab.locator("#freeu").locator("textarea, input").first.fill("1.3,1.4,0.9,0.2")
        with_freeu = generate(tab)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(ARTIFACTS / "pag-freeu.png"), full_page=True)
        tab.close()
    pag, freeu = FIELD["pag_scale"].status, FIELD["freeu"].status
    assert f"· {pag} 3" in with_pag and freeu not in with_pag, with_pag
    assert f"· {freeu} 1.3,1.4,0.9,0.2" in with_freeu and pag not in with_freeu, with_freeu
    assert not errors, errors
