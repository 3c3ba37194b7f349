"""Inpaint only masked (A1111's "Inpaint area: Only masked", diffusers' `padding_mask_crop`): the mask's box.

    box = crop_box(repaint, padding, width, height)     # (x1, y1, x2, y2): the masked area, padded, at the size's ratio
    pixels, repaint = cropped(picture, repaint, box, width, height)   # what the engine inpaints, at the request's size

The masked area's box plus `padding` pixels on each side is widened to the request's aspect ratio, cropped, scaled
to the request's size and inpainted there, so a small mask gets the whole size's detail; `overlay.py` scales the
result back into the box and pastes it over the picture. Exactly diffusers' `VaeImageProcessor.get_crop_region` and
its "fill" resize (`_resize_and_fill`, Lanczos), so a request equals diffusers' PyTorch inpainting pipeline with
`padding_mask_crop` (tests/engine/test_inpaint_modes.py). Host-side numpy and Pillow, no JAX.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .errors import InvalidInput
from .image_inputs import RESAMPLE, binarize

Box = tuple[int, int, int, int]  # (x1, y1, x2, y2): left, top, right and bottom edges (x2, y2 excluded)


def crop_box(repaint: np.ndarray, padding: int, width: int, height: int) -> Box:
    """The box holding every repainted pixel of `repaint` (bool [H, W]), `padding` pixels more on each side (within
    the picture), widened on its short side to the ratio width : height: diffusers' `get_crop_region`, step by step.
    A mask with nothing painted has no box: one sentence."""
    rows, columns = np.flatnonzero(repaint.any(axis=1)), np.flatnonzero(repaint.any(axis=0))
    if rows.size == 0:
        raise InvalidInput(
            "Inpaint area 'Only masked' needs a mask with something painted; paint the area to redraw, "
            "or set the inpaint area to whole."
        )
    h, w = repaint.shape
    x1, y1 = max(int(columns[0]) - padding, 0), max(int(rows[0]) - padding, 0)
    x2, y2 = min(int(columns[-1]) + 1 + padding, w), min(int(rows[-1]) + 1 + padding, h)
    if (x2 - x1) / (y2 - y1) > width / height:
        y1, y2 = _widened(y1, y2, int((x2 - x1) / (width / height) - (y2 - y1)), h)
    else:
        x1, x2 = _widened(x1, x2, int((y2 - y1) * (width / height) - (x2 - x1)), w)
    return x1, y1, x2, y2


def _widened(low: int, high: int, more: int, limit: int) -> tuple[int, int]:
    """[low, high) grown by `more` pixels, half on each side, shifted back inside [0, limit) (diffusers' order of
    corrections: the far edge first, then the near one, then clipped)."""
    low, high = low - more // 2, high + more - more // 2
    if high >= limit:
        low, high = low - (high - limit), limit
    if low < 0:
        low, high = 0, high - low
    return low, min(high, limit)


def resize_fill(image: Image.Image, width: int, height: int) -> Image.Image:
    """Resize to fit inside (width, height), keeping the aspect ratio, centred, the rest filled by stretching the
    edge rows or columns: diffusers' `_resize_and_fill` (resize_mode="fill"), Lanczos. A box already at the ratio
    (what `crop_box` gives) leaves at most a rounding pixel to fill."""
    ratio, src_ratio = width / height, image.width / image.height
    src_w = width if ratio < src_ratio else image.width * height // image.height
    src_h = height if ratio >= src_ratio else image.height * width // image.width
    resized = image.resize((src_w, src_h), resample=RESAMPLE)
    filled = Image.new(image.mode, (width, height))
    filled.paste(resized, box=(width // 2 - src_w // 2, height // 2 - src_h // 2))
    if ratio < src_ratio and height // 2 - src_h // 2 > 0:
        fill = height // 2 - src_h // 2
        filled.paste(resized.resize((width, fill), box=(0, 0, width, 0)), box=(0, 0))
        filled.paste(resized.resize((width, fill), box=(0, src_h, width, src_h)), box=(0, fill + src_h))
    elif ratio > src_ratio and width // 2 - src_w // 2 > 0:
        fill = width // 2 - src_w // 2
        filled.paste(resized.resize((fill, height), box=(0, 0, 0, height)), box=(0, 0))
        filled.paste(resized.resize((fill, height), box=(src_w, 0, src_w, height)), box=(fill + src_w, 0))
    return filled


def cropped(pixels: np.ndarray, repaint: np.ndarray, box: Box, width: int, height: int) -> tuple:
    """The picture (uint8 [H, W, 3]) and mask (bool [H, W]) inside `box`, scaled to (width, height): (uint8
    [height, width, 3], bool [height, width]); the mask as 0/255 levels resized, then binarized at 0.5, as diffusers'
    mask processor does."""
    picture = resize_fill(Image.fromarray(pixels).crop(box), width, height)
    mask = resize_fill(Image.fromarray(repaint.astype(np.uint8) * np.uint8(255), "L").crop(box), width, height)
    return np.asarray(picture, np.uint8).copy(), binarize(np.asarray(mask, np.uint8))
