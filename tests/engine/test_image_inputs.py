"""The request edge's image inputs (pipeline/contract/image_inputs.py): decoding, every refusal in one sentence, mode
conversions, the fit and the mask as diffusers' processors make them (tests/fixtures/image-expected.*)."""

from __future__ import annotations

import io
import json
import re
import struct
import time
import zlib

import numpy as np
import pytest
from conftest import FIXTURES
from PIL import Image
from reference import prepare_image

from pipeline.contract.errors import InvalidInput
from pipeline.contract.fields import FIELD
from pipeline.contract.image_inputs import (
    MAX_IMAGE_PIXELS,
    GivenPath,
    binarize,
    fit,
    latent_mask,
    open_image,
    prepare_image_inputs,
    prepare_mask,
    steps_to_run,
    to_rgb,
)

INPUT_IMAGE, INPUT_MASK = FIXTURES / "image-input.png", FIXTURES / "image-mask.png"
check_strength = FIELD["strength"].check
EXPECTED = np.load(FIXTURES / "image-expected.npz")
INPUT_SIZE = tuple(json.loads((FIXTURES / "image-expected.json").read_text())["inputs"]["size"])  # (width, height)


def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _png(width: int, height: int, bit_depth: int, colour_type: int, rows: bytes) -> bytes:
    """A PNG written by hand (Pillow cannot write every variant): signature, IHDR, one IDAT, IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _refusal(call, *args, **kwargs) -> str:
    """The InvalidInput message of `call`, checked to be one sentence."""
    with pytest.raises(InvalidInput) as error:
        call(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message and message[0].isupper() and message.endswith("."), message
    assert len(re.findall(r"[.!?](?:\s|$)", message)) == 1, message
    return message


def _rgb(source) -> np.ndarray:
    return np.asarray(to_rgb(open_image(source)), np.int16)


# ---- the fit and the mask, against diffusers ------------------------------------------------------------------------


def test_fit_and_mask_equal_diffusers_processors():
    """VaeImageProcessor.resize(resize_mode="crop") and the mask processor's binarize + interpolate, exactly."""
    assert Image.open(INPUT_IMAGE).size == INPUT_SIZE == (96, 80)
    pixels = prepare_image(INPUT_IMAGE, 64, 64)
    assert pixels.dtype == np.uint8 and pixels.shape == (64, 64, 3)
    assert np.array_equal(pixels, EXPECTED["fit_image"])
    repaint = prepare_mask(INPUT_MASK, 64, 64, image_size=INPUT_SIZE)
    assert repaint.dtype == np.bool_ and np.array_equal(repaint, EXPECTED["fit_mask"] == 1)
    assert 0.1 < repaint.mean() < 0.9  # the fixture mask repaints part of the picture
    latents = latent_mask(repaint)
    assert latents.dtype == np.float32 and np.array_equal(latents, EXPECTED["mask_latents"])


@pytest.mark.parametrize("size", [(64, 64), (64, 128), (128, 64), (40, 96), (96, 40), (80, 96)])
def test_fit_gives_the_requested_size_from_any_shape(size):
    height, width = size
    picture = Image.open(INPUT_IMAGE).convert("RGB")
    assert np.asarray(fit(picture, height, width)).shape == (height, width, 3)
    # Centre crop: a picture already of the target's aspect ratio is only scaled.
    scaled = fit(picture.resize((width * 3, height * 3)), height, width)
    assert np.array_equal(
        np.asarray(scaled), np.asarray(picture.resize((width * 3, height * 3)).resize((width, height), Image.LANCZOS))
    )


def test_fit_of_an_extreme_aspect_ratio_resamples_the_kept_part_only():
    rng = np.random.default_rng(3)
    strip = Image.fromarray(rng.integers(0, 256, (10, 2000, 3), dtype=np.uint8))  # 200:1
    direct = np.asarray(fit(strip, 64, 64), np.int16)
    resized = strip.resize((12800, 64), Image.LANCZOS).crop((6368, 0, 6432, 64))  # the two-step way, here cheap
    assert direct.shape == (64, 64, 3) and np.abs(direct - np.asarray(resized, np.int16)).max() <= 1
    wide = Image.new("RGB", (2_000_000, 1), (10, 20, 30))  # would be a 128,000,000 x 64 intermediate
    started = time.perf_counter()
    assert np.asarray(fit(wide, 64, 64)).shape == (64, 64, 3)
    assert time.perf_counter() - started < 5


def test_a_mask_of_another_size_is_stretched_to_its_image_first():
    """A 10x40 mask whose top quarter is white, for a 96x80 image: stretched to 96x80, then the image's fit."""
    levels = np.zeros((40, 10), np.uint8)
    levels[:10] = 255
    repaint = prepare_mask(_encode(Image.fromarray(levels), "PNG"), 64, 64, image_size=INPUT_SIZE)
    assert repaint.shape == (64, 64)
    rows = repaint.mean(axis=1)
    assert rows[:15].min() == 1 and rows[17:].max() == 0  # 20 of 80 rows -> 16 of 64 (a fit of its own: none)
    half = Image.open(INPUT_MASK).resize((48, 40), Image.NEAREST)
    from_half = prepare_mask(_encode(half, "PNG"), 64, 64, image_size=INPUT_SIZE)
    assert np.mean(from_half != EXPECTED["fit_mask"].astype(bool)) < 0.03


def test_binarize_at_half_and_latent_mask_keeps_each_blocks_first_pixel():
    assert binarize(np.array([[0, 127, 128, 255]], np.uint8)).tolist() == [[False, False, True, True]]
    for level, repainted in ((127, False), (128, True)):
        flat = _encode(Image.new("L", (32, 32), level), "PNG")
        assert prepare_mask(flat, 64, 64).all() == repainted and prepare_mask(flat, 64, 64).any() == repainted
    repaint = np.zeros((64, 128), bool)
    repaint[8, 16] = True  # the first pixel of latent (1, 2)
    repaint[9, 33] = True  # inside latent (1, 4), not its first pixel
    latents = latent_mask(repaint)
    assert latents.shape == (1, 8, 16) and latents.sum() == 1 and latents[0, 1, 2] == 1


# ---- sources and conversions -----------------------------------------------------------------------------------------


def test_bytes_path_and_pil_image_give_the_same_pixels():
    data = INPUT_IMAGE.read_bytes()
    from_path = prepare_image(INPUT_IMAGE, 64, 64)
    for source in (data, bytearray(data), memoryview(data), str(INPUT_IMAGE), Image.open(INPUT_IMAGE)):
        assert np.array_equal(prepare_image(source, 64, 64), from_path)


def test_transparency_is_flattened_onto_white():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[0, 0] = (200, 0, 0, 128)  # half-transparent red
    rgba[0, 1] = (10, 20, 30, 255)  # opaque
    pixels = _rgb(_encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    expected = np.round(np.array([200, 0, 0]) * 128 / 255 + 255 * 127 / 255)
    assert np.abs(pixels[0, 0] - expected).max() <= 1
    assert pixels[0, 1].tolist() == [10, 20, 30] and pixels[3, 3].tolist() == [255, 255, 255]
    grey_alpha = Image.fromarray(np.array([[[0, 0], [0, 255], [90, 255]]], np.uint8), "LA")
    assert _rgb(_encode(grey_alpha, "PNG"))[0].tolist() == [[255] * 3, [0] * 3, [90] * 3]


def test_palette_greyscale_bilevel_and_cmyk_are_converted():
    palette = Image.new("P", (4, 2))
    palette.putpalette([255, 0, 0, 0, 0, 255] + [0] * 762)
    palette.putpixel((1, 0), 1)
    assert _rgb(_encode(palette, "PNG"))[0, :2].tolist() == [[255, 0, 0], [0, 0, 255]]
    palette.info["transparency"] = 1  # index 1 transparent: white
    assert _rgb(_encode(palette, "PNG", transparency=1))[0, :2].tolist() == [[255, 0, 0], [255, 255, 255]]
    assert _rgb(_encode(palette, "GIF", transparency=1))[0, :2].tolist() == [[255, 0, 0], [255, 255, 255]]
    grey = Image.fromarray(np.array([[0, 77, 255]], np.uint8), "L")
    assert _rgb(_encode(grey, "PNG"))[0].tolist() == [[0] * 3, [77] * 3, [255] * 3]
    bilevel = Image.new("1", (2, 1), 0)
    bilevel.putpixel((1, 0), 1)
    assert _rgb(_encode(bilevel, "PNG"))[0].tolist() == [[0] * 3, [255] * 3]
    cmyk = Image.new("CMYK", (2, 1), (0, 0, 0, 0))
    cmyk.putpixel((1, 0), (0, 255, 255, 0))  # full magenta + yellow: red
    assert _rgb(_encode(cmyk, "TIFF"))[0].tolist() == [[255, 255, 255], [255, 0, 0]]


def test_sixteen_bit_pictures_are_scaled_not_clipped():
    grey = np.array([[0, 32767, 32896, 65535]], np.uint16)
    image = open_image(_png(4, 1, 16, 0, b"\0" + grey.astype(">u2").tobytes()))
    assert image.mode.startswith("I")
    assert _rgb(_png(4, 1, 16, 0, b"\0" + grey.astype(">u2").tobytes()))[0, :, 0].tolist() == [0, 127, 128, 255]
    rgb = np.array([[[65535, 32768, 0]]], np.uint16)
    assert _rgb(_png(1, 1, 16, 2, b"\0" + rgb.astype(">u2").tobytes()))[0, 0].tolist() == [255, 128, 0]
    blocks = np.repeat(np.repeat(grey, 8, axis=1), 8, axis=0).astype(">u2")  # [8, 32]: 8-pixel blocks, no resize
    mask = prepare_mask(_png(32, 8, 16, 0, b"".join(b"\0" + row.tobytes() for row in blocks)), 8, 32)
    assert mask[4, ::8].tolist() == [False, False, True, True]  # 32767 -> 127 keeps, 32896 -> 128 repaints


def test_exif_orientation_is_applied():
    picture = Image.new("RGB", (16, 8), (0, 0, 0))
    picture.paste((255, 255, 255), (0, 0, 8, 8))  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    turned = open_image(_encode(picture, "JPEG", exif=exif, quality=95))
    assert turned.size == (8, 16)
    top, bottom = np.asarray(turned.convert("L"), np.int16)[:8].mean(), np.asarray(turned.convert("L"))[8:].mean()
    assert top > 200 and bottom < 50  # the white half is on top once turned
    inputs = prepare_image_inputs(_encode(picture, "JPEG", exif=exif), height=64, width=64, steps=4, strength=0.5)
    assert inputs.source_size == (8, 16)


def test_a_phone_mpo_gives_its_first_picture():
    first, second = Image.new("RGB", (8, 8), (200, 10, 10)), Image.new("RGB", (8, 8), (10, 200, 10))
    data = _encode(first, "MPO", save_all=True, append_images=[second], quality=95)
    assert Image.open(io.BytesIO(data)).format == "MPO"
    assert np.abs(_rgb(data)[4, 4] - np.array([200, 10, 10])).max() <= 4


def test_mask_transparency_is_black_and_colours_are_luma():
    stroke = np.zeros((8, 8, 4), np.uint8)
    stroke[:, :4] = (255, 255, 255, 255)  # opaque white on the left, transparent elsewhere
    repaint = prepare_mask(_encode(Image.fromarray(stroke, "RGBA"), "PNG"), 8, 8)
    assert repaint[:, :4].all() and not repaint[:, 4:].any()
    green = Image.new("RGB", (8, 8), (0, 255, 0))  # luma 0.587 x 255 = 150: repaint
    blue = Image.new("RGB", (8, 8), (0, 0, 255))  # luma 29: keep
    assert prepare_mask(_encode(green, "PNG"), 8, 8).all() and not prepare_mask(_encode(blue, "PNG"), 8, 8).any()


# ---- refusals: one sentence each -------------------------------------------------------------------------------------


def test_not_a_picture_is_one_sentence(tmp_path):
    assert "is not a picture in a format this server reads" in _refusal(open_image, b"hello, world")
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"  # Pillow reads EPS through Ghostscript
    assert "is not a picture" in _refusal(open_image, eps)
    text_file = tmp_path / "notes.png"
    text_file.write_text("not a picture")
    assert _refusal(open_image, text_file, what="mask").startswith("The mask is not a picture")
    assert "is empty" in _refusal(open_image, b"")
    assert "does not exist" in _refusal(open_image, tmp_path / "missing.png")
    # A server's path (an upload in Gradio's cache) is named by its file name; a path the user typed, as typed.
    upload = "/srv/cache/ab12/photo.png"
    assert _refusal(open_image, upload) == "The image file 'photo.png' does not exist or is not a file."
    typed = GivenPath("../pictures/photo.png")
    assert _refusal(open_image, typed) == "The image file '../pictures/photo.png' does not exist or is not a file."
    assert "does not exist or is not a file" in _refusal(open_image, tmp_path)
    assert "got a value of type int" in _refusal(open_image, 42)


def test_truncated_file_is_one_sentence():
    data = _encode(Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)), "PNG")
    assert "damaged or incomplete" in _refusal(open_image, data[: len(data) // 2])


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP"])
def test_animations_are_refused_in_one_sentence(fmt):
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    data = _encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    assert _refusal(open_image, data) == "The image is animated (3 frames); upload a still picture."
    assert "animated" in _refusal(open_image, Image.open(io.BytesIO(data)))  # a PIL image gets the same check


def test_multi_page_tiff_is_refused_and_one_page_passes():
    pages = [Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 255, 0))]
    data = _encode(pages[0], "TIFF", save_all=True, append_images=pages[1:])
    assert _refusal(open_image, data, what="mask") == "The mask is a TIFF with 2 pages; upload a single picture."
    assert open_image(_encode(pages[0], "TIFF")).size == (8, 8)


def test_decompression_bomb_is_refused_from_its_header():
    """A 10000x6000 PNG header with a few bytes of data: refused by its size (decoding it would fail differently)."""
    bomb = _png(10_000, 6_000, 8, 2, b"\0" * 64)
    message = _refusal(open_image, bomb)
    assert message == (
        "The image is 10000×6000 pixels (60.0 megapixels), over the limit of 50 megapixels; "
        "scale it down and upload it again."
    )
    assert "larger than 50 megapixels" in _refusal(open_image, _png(20_000, 20_000, 8, 2, b"\0"))  # Pillow's own
    assert 7071 * 7071 <= MAX_IMAGE_PIXELS < 7072 * 7072
    assert "7072×7072" in _refusal(open_image, Image.new("1", (7072, 7072)))
    assert open_image(Image.new("1", (7071, 7071))).size == (7071, 7071)


def test_float_pixels_are_refused_in_one_sentence():
    assert "floating-point" in _refusal(to_rgb, Image.new("F", (4, 4), 0.5))


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.0000001, 1.5, float("nan"), float("inf"), "0.5", True, None])
def test_strength_out_of_range_is_one_sentence(value):
    assert _refusal(check_strength, value).startswith("Strength must be a number above 0 and at most 1; got ")


def test_strength_in_range_and_steps_run():
    assert check_strength(1) == 1.0 and check_strength(np.float32(0.5)) == 0.5 and check_strength(1e-6) == 1e-6
    assert steps_to_run(30, 0.75) == 22 and steps_to_run(4, 1.0) == 4
    message = _refusal(steps_to_run, 4, 0.2)
    assert message == (
        "Strength 0.2 with 4 steps leaves no step to run (int(4 × 0.2) = 0); use a strength of at least 0.25 or more "
        "steps."
    )


def test_request_inputs_a_mask_needs_an_image():
    assert prepare_image_inputs(None, None, 0.5, height=64, width=64, steps=4) is None
    message = _refusal(prepare_image_inputs, None, INPUT_MASK, 0.5, height=64, width=64, steps=4)
    assert message == "A mask needs an image to repaint; add the image or remove the mask."


def test_request_inputs_shapes_and_order_of_checks():
    inputs = prepare_image_inputs(INPUT_IMAGE, INPUT_MASK, 0.75, height=64, width=64, steps=8)
    assert inputs.pixels.shape == (64, 64, 3) and inputs.pixels.dtype == np.uint8
    assert inputs.repaint.shape == (64, 64) and inputs.repaint.dtype == np.bool_
    assert inputs.repaint_latents.shape == (1, 8, 8) and inputs.repaint_latents.dtype == np.float32
    assert (inputs.strength, inputs.steps_run, inputs.source_size) == (0.75, 6, INPUT_SIZE)
    assert np.array_equal(inputs.repaint_latents, EXPECTED["mask_latents"])
    no_mask = prepare_image_inputs(INPUT_IMAGE.read_bytes(), None, 1, height=128, width=64, steps=4)
    assert no_mask.repaint is None and no_mask.repaint_latents is None and no_mask.pixels.shape == (128, 64, 3)
    # Strength is checked before the file is decoded.
    assert _refusal(prepare_image_inputs, b"junk", None, 2, height=64, width=64, steps=4).startswith("Strength")
    assert "The mask is not a picture" in _refusal(
        prepare_image_inputs, INPUT_IMAGE, b"junk", 0.5, height=64, width=64, steps=4
    )
