"""FreeU and perturbed-attention guidance (issue 67, parts 2-3): diffusers' Fourier filter, the per-row plan, the
one-sentence refusals, Forge's alwayson scripts, and the engine's pictures with them (no request compiles)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import TEST_SIZE, served_programs_only

from pipeline.contract.errors import InvalidInput
from pipeline.contract.parameters import parse_infotext
from pipeline.contract.request import RequestRules, parse_request
from pipeline.device.freeu import fourier_filter
from pipeline.host.planning.extras_plan import extras_plan
from pipeline.host.planning.sampler_plan import COEFFICIENTS
from web.apis.a1111_fields import a1111_request

OFFERED = RequestRules(sizes=((64, 64),), pag=True, freeu=True)


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
    got = np.asarray(fourier_filter(np.transpose(x, (0, 2, 3, 1)), scales)).transpose(0, 3, 1, 2)
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
def extras_engine(tiny_dir):
    """The tiny checkpoint on one device with --pag and --freeu-programs, no levers, one window, no previews: it
    compiles, on first use, only the programs its tests run."""
    from pipeline.generator import Generator

    return Generator.from_pretrained(
        str(tiny_dir),
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


def test_engine_freeu_and_pag_pictures(extras_engine):
    """One program with both (the costliest combination; each alone is the same hooks): FreeU at 1,1,1,1 with PAG
    whose adaptive scale is 0 on every step is today's picture within 1 level (the FFT's round trip; the perturbed
    rows change neither the unconditional nor the conditional ones); SDXL's FreeU with PAG at 3 changes it; the
    `parameters` text says both; nothing unserved compiles."""
    generator = extras_engine

    def image(**fields):
        result = generator.generate(generator.request("a lighthouse", seed=3, guidance_scale=5, **fields))
        return np.asarray(result.images[0]).astype(np.int16), result.parameters[0]

    with served_programs_only(generator):
        plain, _ = image()
        neutral, _ = image(freeu="1,1,1,1", pag_scale=0.5, pag_adaptive_scale=1)  # 0.5 − (1000 − t) < 0 at every t
        both, text = image(freeu="1.3,1.4,0.9,0.2", pag_scale=3)
    assert np.abs(neutral - plain).max() <= 1
    assert np.mean(both != plain) > 0.5
    settings = parse_infotext(text).settings
    assert (settings["FreeU"], settings["PAG scale"]) == ("1.3,1.4,0.9,0.2", "3")
