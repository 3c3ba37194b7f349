"""Image inputs at the request edge: the init image and the inpainting mask, checked, decoded and fitted.

What a request may send (bytes, a path, or a PIL image) and what the engine gets back:

    inputs = prepare_image_inputs(image, mask, strength, height=H, width=W, steps=n)
    inputs.pixels            # uint8 [H, W, 3]: the init image, fitted to the request's size
    inputs.repaint           # bool [H, W] or None: True = repaint (white in the mask)
    inputs.repaint_latents   # float32 [1, H/8, W/8] or None: the same mask at latent size

The meaning is diffusers' PyTorch SDXL img2img and inpainting pipelines': the image is fitted with their
`resize_mode="crop"` (A1111's "crop and resize"), scaled to [-1, 1] on the device; the mask is fitted the same way,
binarized at 0.5 and nearest-downsampled to the latents (`prepare_mask_latents`). Every refusal is one sentence
(`InvalidInput`). Decoding is guarded: only the formats in FORMATS are opened (Pillow's other plugins include
EPS, which runs Ghostscript), and an image over MAX_IMAGE_PIXELS is refused from its header, before any pixel is
decoded. Kept free of JAX and of the engine, so the web layer can import it cheaply.
"""

from __future__ import annotations

import io
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import InvalidInput
from .fields import FIELD, echo

#: Largest picture decoded, in pixels (50 MP): a 48-MP phone photo (8000×6000) passes; a larger one is refused from
#: its header before decoding (it would take ~150 MB of RGB and seconds of resampling for a 1024² request).
#: Pillow's own bomb error comes only at 2 × 89.5 MP.
MAX_IMAGE_PIXELS = 50_000_000
#: Picture formats opened (Pillow's format ids); MPO is the JPEG variant phones write (handled by the JPEG plugin).
FORMATS = ("PNG", "JPEG", "WEBP", "AVIF", "GIF", "BMP", "TIFF")
#: The formats as a sentence names them (the picture inputs and PNG Info say the same list).
FORMAT_NAMES = ", ".join(FORMATS[:-1]) + " or " + FORMATS[-1]
#: Transparent parts of an init image are filled with white, as A1111's img2img does (its default background).
IMAGE_BACKGROUND = (255, 255, 255)
#: Transparent parts of a mask count as black (keep): only what is painted is repainted.
MASK_BACKGROUND = (0, 0, 0)
#: diffusers' VaeImageProcessor resamples with Lanczos (its `resample="lanczos"` default), images and masks alike.
RESAMPLE = Image.Resampling.LANCZOS
#: 8-bit level from which a mask pixel means "repaint": diffusers binarizes level / 255 at 0.5, so 128 and up.
MASK_THRESHOLD = 128
#: A fit whose resized intermediate would exceed this many times the target's pixels (a source whose aspect ratio is
#: 16× off the target's) resamples the kept region straight from the source instead (Pillow's box resize).
MAX_FIT_INTERMEDIATE = 16
#: Modes of 16-bit (or 32-bit integer) greyscale, scaled to 8 bits by 255 / 65535.
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
#: Modes that carry transparency (besides "P" with a `transparency` entry).
_WITH_ALPHA = ("RGBA", "RGBa", "LA", "PA")


class GivenPath(os.PathLike):
    """A file path its user typed (the CLI's --init-image, --mask-image, --control-image): a refusal names it as
    given, folders and all. Any other path is named by its file name only: on a server it is the server's own (an
    upload in Gradio's cache), which no client should see."""

    def __init__(self, text: str) -> None:
        self.text = str(text)

    def __fspath__(self) -> str:
        return os.path.expanduser(self.text)

    def __repr__(self) -> str:
        return f"GivenPath({self.text!r})"


ImageSource = bytes | bytearray | memoryview | str | os.PathLike | Image.Image


@dataclass(frozen=True)
class ImageInputs:
    """One request's checked image inputs, ready for the device."""

    pixels: np.ndarray  # uint8 [H, W, 3]: the init image, fitted to (height, width)
    repaint: np.ndarray | None  # bool [H, W]: True = repaint (the binarized mask); None without a mask
    repaint_latents: np.ndarray | None  # float32 [1, h, w] (h = H / 8): `repaint` nearest-downsampled; None likewise
    strength: float  # in (0, 1]
    steps_run: int  # denoising steps that run: int(steps × strength), as diffusers' `get_timesteps`
    source_size: tuple[int, int]  # (width, height) of the uploaded image after its EXIF orientation


# ---- decoding ------------------------------------------------------------------------------------------------------


def _too_large(what: str, size: tuple[int, int] | None) -> InvalidInput:
    limit = f"{MAX_IMAGE_PIXELS / 1e6:g} megapixels"
    if size is None:
        return InvalidInput(f"The {what} is larger than {limit}, the limit; scale it down and upload it again.")
    width, height = size
    return InvalidInput(
        f"The {what} is {width}×{height} pixels ({width * height / 1e6:.1f} megapixels), over the limit of {limit}; "
        "scale it down and upload it again."
    )


def _not_a_picture(what: str) -> InvalidInput:
    return InvalidInput(f"The {what} is not a picture in a format this server reads ({FORMAT_NAMES}).")


def _check_still(image: Image.Image, what: str) -> None:
    """Refuse animations and multi-page files; an MPO's extra frames are previews or depth maps, so it passes."""
    if image.format == "MPO" or not getattr(image, "is_animated", False):
        return
    frames = getattr(image, "n_frames", 2)
    if image.format == "TIFF":
        raise InvalidInput(f"The {what} is a TIFF with {frames} pages; upload a single picture.")
    raise InvalidInput(f"The {what} is animated ({frames} frames); upload a still picture.")


def _check_pixels(size: tuple[int, int], what: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise InvalidInput(f"The {what} has no pixels ({width}×{height}).")
    if width * height > MAX_IMAGE_PIXELS:
        raise _too_large(what, size)


def open_image(source: ImageSource, *, what: str = "image") -> Image.Image:
    """Decode one still picture, checked, in its file's orientation (EXIF applied), any mode: a loaded PIL image.

    `what` ("image", "mask") names the input in messages. The size and frame checks read the header only; pixels are
    decoded after them. A PIL image given directly gets the same checks (it is already decoded).
    """
    if isinstance(source, Image.Image):
        _check_still(source, what)
        _check_pixels(source.size, what)
        return _decoded(source, what)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise InvalidInput(f"The {what} is empty (0 bytes).")
        stream: io.BytesIO | Path = io.BytesIO(data)
    elif isinstance(source, (str, os.PathLike)):
        stream = Path(source)
        if not stream.is_file():
            shown = repr(source.text) if isinstance(source, GivenPath) else echo(stream.name)  # whole: the user's own
            raise InvalidInput(f"The {what} file {shown} does not exist or is not a file.")
        if stream.stat().st_size == 0:
            raise InvalidInput(f"The {what} is empty (0 bytes).")
    else:
        raise InvalidInput(
            f"The {what} must be a picture file (its bytes or its path) or a PIL image; "
            f"got a value of type {type(source).__name__}."
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit is lower; we refuse below
        try:
            image = Image.open(stream, formats=FORMATS)
        except Image.DecompressionBombError:
            raise _too_large(what, None) from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError):
            raise _not_a_picture(what) from None
    with image:
        _check_still(image, what)
        _check_pixels(image.size, what)
        return _decoded(image, what)


def _decoded(image: Image.Image, what: str) -> Image.Image:
    """The pixels decoded (first frame of an MPO), EXIF orientation applied: a new image, independent of the file."""
    try:
        if image.format == "MPO":
            image.seek(0)
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError):
        raise InvalidInput(f"The {what} file is damaged or incomplete; its pixels could not be decoded.") from None
    try:
        return ImageOps.exif_transpose(image)  # a copy, turned as the camera meant it
    except Exception:  # a broken EXIF block: keep the pixels as stored
        return image.copy()


# ---- modes ---------------------------------------------------------------------------------------------------------


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in _WITH_ALPHA or (image.mode == "P" and "transparency" in image.info)


def _to_eight_bit(image: Image.Image, what: str) -> Image.Image:
    """16-bit greyscale scaled to 8 bits (Pillow's own convert would clip at 255); float images refused."""
    if image.mode in _SIXTEEN_BIT:
        levels = np.asarray(image).astype(np.float64)  # [H, W]
        return Image.fromarray(np.clip(np.round(levels * (255 / 65535)), 0, 255).astype(np.uint8), mode="L")
    if image.mode == "F":
        raise InvalidInput(
            f"The {what} has 32-bit floating-point pixels, which have no set range; save it as an 8- or 16-bit picture."
        )
    return image


def _flatten(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """Alpha-composite onto a solid background: RGB."""
    rgba = image.convert("RGBA")
    base = Image.new("RGBA", image.size, (*background, 255))
    return Image.alpha_composite(base, rgba).convert("RGB")


def to_rgb(image: Image.Image, *, what: str = "image") -> Image.Image:
    """Any mode -> RGB: transparency onto white, greyscale and palette expanded, 16-bit scaled, CMYK converted."""
    image = _to_eight_bit(image, what)
    if image.mode == "RGB":
        return image
    if _has_alpha(image):
        return _flatten(image, IMAGE_BACKGROUND)
    try:
        return image.convert("RGB")  # 1, L, P, CMYK (no ICC profile applied), YCbCr, LAB, HSV
    except ValueError:
        raise InvalidInput(f"The {what}'s colour mode {image.mode} cannot be converted to RGB.") from None


def to_mask_levels(image: Image.Image) -> Image.Image:
    """A mask picture -> "L" or "RGB" levels (made grey after the fit, as diffusers does): transparency is black."""
    image = _to_eight_bit(image, "mask")
    if image.mode in ("L", "RGB"):
        return image
    if _has_alpha(image):
        return _flatten(image, MASK_BACKGROUND)
    try:
        return image.convert("L") if image.mode == "1" else image.convert("RGB")
    except ValueError:
        raise InvalidInput(f"The mask's colour mode {image.mode} cannot be converted to grey levels.") from None


# ---- fitting -------------------------------------------------------------------------------------------------------


def fit(image: Image.Image, height: int, width: int) -> Image.Image:
    """Resize to cover (height, width), keeping the aspect ratio, then crop the centre: diffusers' `resize_mode="crop"`.

    Exactly `VaeImageProcessor._resize_and_crop`: the side that fits is scaled to the target, the other to
    floor(side × target / fitting side), Lanczos; the crop starts at floor(resized / 2) - floor(target / 2) on each
    axis. When that intermediate would exceed MAX_FIT_INTERMEDIATE × the target's pixels (aspect ratios 16× apart),
    the same region is resampled from the source directly (Pillow's box resize), at most 1 level off in rare pixels.
    """
    if image.size == (width, height):
        return image
    ratio, src_ratio = width / height, image.width / image.height
    src_w = width if ratio > src_ratio else image.width * height // image.height
    src_h = height if ratio <= src_ratio else image.height * width // image.width
    left, top = src_w // 2 - width // 2, src_h // 2 - height // 2
    if src_w * src_h <= MAX_FIT_INTERMEDIATE * width * height:
        return image.resize((src_w, src_h), resample=RESAMPLE).crop((left, top, left + width, top + height))
    scale_x, scale_y = image.width / src_w, image.height / src_h
    box = (left * scale_x, top * scale_y, (left + width) * scale_x, (top + height) * scale_y)
    return image.resize((width, height), resample=RESAMPLE, box=box)


def binarize(levels: np.ndarray) -> np.ndarray:
    """uint8 levels [H, W] -> bool [H, W], True = repaint: diffusers' `binarize` (level / 255 >= 0.5)."""
    return levels >= MASK_THRESHOLD


def latent_mask(repaint: np.ndarray, vae_scale_factor: int = 8) -> np.ndarray:
    """bool [H, W] -> float32 [1, H/f, W/f]: torch's `interpolate(mode="nearest")` to latent size, as diffusers'
    `prepare_mask_latents` does (for an integer factor f it keeps pixel (f·i, f·j))."""
    height, width = repaint.shape
    if height % vae_scale_factor or width % vae_scale_factor:
        raise ValueError(f"mask size {width}x{height} is not a multiple of {vae_scale_factor}")
    return repaint[None, ::vae_scale_factor, ::vae_scale_factor].astype(np.float32)


def prepare_mask(
    source: ImageSource, height: int, width: int, *, image_size: tuple[int, int] | None = None
) -> np.ndarray:
    """Decode, fit and binarize a mask (white = repaint): bool [height, width].

    A mask of another size than its image (`image_size`, (width, height) after EXIF orientation) is first stretched
    to the image's size (Lanczos), so it lines up with the image; then it gets the image's own fit. Grey levels are
    taken after the fit (Pillow's "L", ITU-R 601 luma), as diffusers' mask processor does.
    """
    mask = to_mask_levels(open_image(source, what="mask"))
    if image_size is not None and mask.size != tuple(image_size):
        mask = mask.resize(tuple(image_size), resample=RESAMPLE)
    levels = np.asarray(fit(mask, height, width).convert("L"), dtype=np.uint8)  # [H, W]
    return binarize(levels)


# ---- strength ------------------------------------------------------------------------------------------------------


def steps_to_run(steps: int, strength: float) -> int:
    """Denoising steps an image request runs: diffusers' `get_timesteps`, min(int(steps × strength), steps).

    None at all is refused, as diffusers' inpainting pipeline does ("... which is < 1 and not appropriate").
    """
    run = min(int(steps * strength), steps)
    if run < 1:
        least = math.ceil(100 / steps) / 100  # the smallest 2-decimal strength with int(steps × s) >= 1
        while int(steps * least) < 1:
            least += 0.01
        raise InvalidInput(
            f"Strength {strength:g} with {steps} steps leaves no step to run (int({steps} × {strength:g}) = 0); "
            f"use a strength of at least {least:.2f} or more steps."
        )
    return run


# ---- the whole request ---------------------------------------------------------------------------------------------


def prepare_image_inputs(
    image: ImageSource | None,
    mask: ImageSource | None = None,
    strength: object = 1.0,
    *,
    height: int,
    width: int,
    steps: int,
    vae_scale_factor: int = 8,
) -> ImageInputs | None:
    """Check and prepare a request's init image, mask and strength; None when it has neither image nor mask.

    Checks run in the order a user would fix them: a mask needs an image; strength; the steps it leaves; then the
    image's and the mask's files.
    """
    if image is None:
        if mask is not None:
            raise InvalidInput("A mask needs an image to repaint; add the image or remove the mask.")
        return None
    number = FIELD["strength"].check(strength)
    run = steps_to_run(steps, number)
    picture = to_rgb(open_image(image, what="image"))
    pixels = np.asarray(fit(picture, height, width), dtype=np.uint8).copy()  # [H, W, 3]
    repaint = repaint_latents = None
    if mask is not None:
        repaint = prepare_mask(mask, height, width, image_size=picture.size)  # [H, W]
        repaint_latents = latent_mask(repaint, vae_scale_factor)  # [1, h, w]
    return ImageInputs(
        pixels=pixels,
        repaint=repaint,
        repaint_latents=repaint_latents,
        strength=number,
        steps_run=run,
        source_size=picture.size,
    )
