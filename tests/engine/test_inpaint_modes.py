"""Outpainting, inpaint only masked and the overlay (issue 69, parts 2 and 3): host-side image work around the
inpainting run, on the programs every server compiles.

Outpainting keeps the picture's pixels outside the mask's blur band bit for bit; inpaint only masked equals
diffusers' PyTorch inpainting pipeline with `padding_mask_crop` within 2 levels (tests/fixtures/inpaint-crop-expected.*,
scripts/make_inpaint_modes_fixtures.py); plain inpainting is unchanged unless the request asks for the overlay.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import FIXTURES, TEST_SIZE
from PIL import Image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.inpaint_crop import crop_box
from pipeline.contract.outpaint import read_sides
from pipeline.contract.overlay import soft_mask
from pipeline.contract.parameters import parse_infotext
from pipeline.contract.request import Request, RequestRules, parse_request

PICTURE = FIXTURES / "image-input.png"
EXPECTED = json.loads((FIXTURES / "inpaint-crop-expected.json").read_text())
ARRAYS = np.load(FIXTURES / "inpaint-crop-expected.npz")
FIELDS = {"seed": 1234, "steps": 4, "sampler": "Euler", "guidance_scale": 6.5}


def _levels(image) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


# ---- the request edge: no engine ------------------------------------------------------------------------------------


def test_outpaint_sides_read_as_fooocus_and_mk2_write_them():
    assert read_sides("left=128 right=128").text == "left=128 right=128"
    assert read_sides("Top=8, bottom: 16").text == "up=8 down=16"
    assert not read_sides("") and not read_sides(None)


@pytest.mark.parametrize(
    ("outpaint", "sentence"),
    [
        ("left=-8", r"^outpaint's left side must be a whole number of pixels from 0 to 2048; got -8\.$"),
        ("left=8 left=16", r"^outpaint names the left side twice \('left=8 left=16'\); give each side once\.$"),
        ("sideways=8", r"^outpaint 'sideways=8' is not understood; write the pixels per side, e\.g\. "),
        (
            "left=40 right=20",
            r"^Outpainting left=40 right=20 leaves no room for the picture in 64×64 \(the canvas keeps at least 8 "
            r"pixels of it each way\); sizes that would: 128×64\.$",
        ),
        ("up=60", r"^Outpainting up=60 leaves no room .*; no size this server offers does; add fewer pixels\.$"),
    ],
)
def test_bad_outpaint_is_one_sentence(outpaint, sentence):
    rules = RequestRules(sizes=((64, 64), (64, 128)))
    with pytest.raises(InvalidInput, match=sentence):
        parse_request("a cabin", init_image=PICTURE, outpaint=outpaint, size=(64, 64), rules=rules)


def test_outpaint_and_only_masked_refuse_what_they_cannot_use():
    rules = RequestRules(sizes=((64, 64),))
    white = np.zeros((64, 64), np.uint8)
    with pytest.raises(InvalidInput, match=r"^Outpainting needs a picture to grow"):
        parse_request("a cabin", outpaint="left=8", rules=rules)
    with pytest.raises(InvalidInput, match=r"^Outpainting makes its own mask"):
        parse_request("a cabin", init_image=PICTURE, mask_image=Image.fromarray(white), outpaint="left=8", rules=rules)
    with pytest.raises(InvalidInput, match=r"^Inpaint area 'Only masked' needs a mask with something painted"):
        parse_request(
            "a cabin", init_image=PICTURE, mask_image=Image.fromarray(white), inpaint_area="only_masked", rules=rules
        )
    with pytest.raises(InvalidInput, match=r"^mask_blur must be a whole number from 0 to 64; got -1\.$"):
        parse_request("a cabin", init_image=PICTURE, mask_blur=-1, rules=rules)


@pytest.mark.parametrize("case", EXPECTED["cases"], ids=lambda case: case["name"])
def test_crop_box_is_diffusers_get_crop_region(case):
    box = crop_box(ARRAYS["mask"] >= 128, case["padding_mask_crop"], 64, 64)
    assert list(box) == case["crop_box"]


def test_a_follower_arranges_the_same_picture_from_the_wire():
    """The leader's picture and the one a follower (or the engine service) rebuilds from `to_dict` agree."""
    rules = RequestRules(sizes=((64, 64),))
    for fields in (
        {"outpaint": "left=16 down=8"},
        {"mask_image": Image.fromarray(ARRAYS["mask"]), "inpaint_area": "Only masked"},
    ):
        request = parse_request("a cabin", init_image=PICTURE, rules=rules, **fields)
        here, there = request.picture(), Request.from_dict(request.to_dict()).picture()
        for a, b in ((here.pixels, there.pixels), (here.repaint, there.repaint), (here.paste.soft, there.paste.soft)):
            np.testing.assert_array_equal(a, b)
        assert here.paste.box == there.paste.box


# ---- through the engine ---------------------------------------------------------------------------------------------


def test_outpainting_keeps_the_picture_bit_for_bit_outside_the_blur_band(feature_engine):
    before = feature_engine.compile_count
    request = feature_engine.request(
        "a cabin", init_image=PICTURE, outpaint="left=16 up=8", strength=1.0, mask_blur=2, **FIELDS
    )
    canvas = request.picture().pixels  # [64, 64, 3]: the picture fitted into 48x56 at (16, 8), the border filled
    result = feature_engine.generate(request)
    assert feature_engine.compile_count == before
    band = 2 + 3 * 2  # mk2's shrink by mask_blur, then the blur's reach (3 sigma)
    for image in result.images:
        got = np.asarray(image)
        np.testing.assert_array_equal(got[8 + band :, 16 + band :], canvas[8 + band :, 16 + band :])
        assert np.abs(_levels(got[:8]) - canvas[:8]).max() > 8  # the border was drawn, not the fill returned
    settings = parse_infotext(result.parameters[0]).settings
    assert settings["Outpaint"] == "left=16 up=8" and settings["Mask blur"] == "2"
    assert settings["Size"] == f"{TEST_SIZE}x{TEST_SIZE}"


@pytest.mark.parametrize("case", EXPECTED["cases"], ids=lambda case: case["name"])
def test_inpaint_only_masked_equals_diffusers_padding_mask_crop(feature_engine, case):
    before = feature_engine.compile_count
    request = feature_engine.request(
        case["prompt"],
        init_image=Image.fromarray(ARRAYS["fit_image"]),
        mask_image=Image.fromarray(ARRAYS["mask"]),
        inpaint_area="only_masked",
        only_masked_padding=case["padding_mask_crop"],
        mask_blur=0,  # diffusers' overlay takes the mask as given
        strength=case["strength"],
        seed=case["seed"],
        steps=case["steps"],
        sampler="Euler",
        guidance_scale=case["guidance_scale"],
    )
    result = feature_engine.generate(request)
    got, expected = _levels(result.images[0]), ARRAYS[case["name"]][0].astype(np.int16)
    assert np.abs(got - expected).max() <= 2
    keep = ARRAYS["mask"] < 128
    np.testing.assert_array_equal(got[keep], ARRAYS["fit_image"][keep])  # outside the mask: the picture itself
    settings = parse_infotext(result.parameters[0]).settings
    assert settings["Inpaint area"] == "Only masked"
    assert settings["Masked area padding"] == str(case["padding_mask_crop"])
    assert feature_engine.compile_count == before


def test_the_overlay_is_asked_for_and_plain_inpainting_stays_diffusers(feature_engine):
    """Without `inpaint_overlay` the answer is diffusers' (the parity tests of test_img2img.py); with it, the
    picture outside the blurred mask is the picture, and the rest the same answer."""
    mask = Image.fromarray(ARRAYS["mask"])
    fields = {**FIELDS, "init_image": Image.fromarray(ARRAYS["fit_image"]), "mask_image": mask, "strength": 0.75}
    plain = feature_engine.generate(feature_engine.request("a cabin", **fields))
    overlaid = feature_engine.generate(feature_engine.request("a cabin", inpaint_overlay="on", **fields))
    assert "Inpaint overlay" not in plain.parameters[0]
    assert "Mask blur: 4, Inpaint overlay: on" in overlaid.parameters[0]
    soft = soft_mask(ARRAYS["mask"] >= 128, 4)  # mask_blur's default
    got, made = np.asarray(overlaid.images[0]), np.asarray(plain.images[0])
    np.testing.assert_array_equal(got[soft == 0], ARRAYS["fit_image"][soft == 0])
    np.testing.assert_array_equal(got[soft == 255], made[soft == 255])
    assert (made[soft == 0] != ARRAYS["fit_image"][soft == 0]).any()  # diffusers' own output: the VAE's round trip


def test_the_cli_flags_make_the_same_request():
    """`--outpaint "left=16 right=16"`, `--mask-blur`, `--inpaint-area`, `--only-masked-padding` and
    `--inpaint-overlay` are the table's flags: the request the API's names make."""
    from pipeline.__main__ import build_parser, request_arguments

    rules = RequestRules(sizes=((64, 64),))
    base = ["generate", "--model", "tiny", "--out", "unused", "--prompt", "a cabin", "--init-image", str(PICTURE)]
    grown = parse_request(
        **request_arguments(build_parser().parse_args([*base, "--outpaint", "left=16 right=16"])), rules=rules
    )
    assert (grown.outpaint, grown.mask_blur) == ("left=16 right=16", 4)
    assert (
        grown.picture().pixels.tobytes()
        == parse_request("a cabin", init_image=PICTURE, outpaint="left=16 right=16", rules=rules)
        .picture()
        .pixels.tobytes()
    )
    flags = [
        "--mask-image",
        str(FIXTURES / "image-mask.png"),
        "--inpaint-area",
        "only_masked",
        "--only-masked-padding",
        "8",
    ]
    masked = parse_request(
        **request_arguments(build_parser().parse_args([*base, *flags, "--mask-blur", "2"])), rules=rules
    )
    assert (masked.inpaint_area, masked.only_masked_padding, masked.mask_blur) == ("Only masked", 8, 2)
    overlaid = parse_request(
        **request_arguments(build_parser().parse_args([*base, "--inpaint-overlay", "on"])), rules=rules
    )
    assert overlaid.inpaint_overlay == "on"
