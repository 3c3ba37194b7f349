"""The overlay: what an inpainted picture becomes once its untouched pixels are pasted back, as A1111 does.

    paste = Paste(original, soft, box)          # uint8 [H, W, 3], uint8 [H, W] (255 = repaint), (x1, y1, x2, y2)
    images = paste.apply(pixels)                # uint8 [n, H, W, 3] as the engine made them -> as returned

The engine inpaints at the request's size; `apply` scales each result into `box` (the whole picture, or inpaint only
masked's box, `inpaint_crop.py`) and lays the original over it through the soft mask: where the mask is 0 the
original's pixels come back exactly, where it is 255 the engine's, between them a blend. This is diffusers'
`VaeImageProcessor.apply_overlay` and A1111's `apply_overlay` (the same Pillow steps: the original premultiplied
("RGBa") and pasted through the inverted mask, alpha-composited over the result), with the blurred mask A1111 uses
(`mask_blur`). Outpainting and inpaint only masked always overlay; plain inpainting keeps diffusers' own output
unless a request asks (`inpaint_overlay`). Host-side Pillow, no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from .image_inputs import fit


def soft_mask(repaint: np.ndarray, blur: int) -> np.ndarray:
    """bool [H, W] (True = repaint) -> uint8 levels [H, W] softened by a Gaussian blur of `blur` pixels (A1111's
    `mask_blur`; 0 keeps the mask hard)."""
    levels = Image.fromarray(repaint.astype(np.uint8) * np.uint8(255), "L")
    return np.asarray(levels.filter(ImageFilter.GaussianBlur(blur)) if blur else levels, np.uint8).copy()


@dataclass(frozen=True)
class Paste:
    """How one request's inpainted pictures go back over its picture."""

    original: np.ndarray  # uint8 [H, W, 3]: the picture as the request gave it (fitted; outpainting's canvas)
    soft: np.ndarray  # uint8 [H, W]: 255 = the engine's pixel, 0 = the original's, between = a blend
    box: tuple[int, int, int, int]  # (x1, y1, x2, y2): where the engine's picture goes (the whole picture: all of it)

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 [n, h, w, 3] (the request's size) -> uint8 [n, H, W, 3]: each scaled into the box and overlaid."""
        keep = Image.new("RGBa", self.original.shape[1::-1])
        keep.paste(
            Image.fromarray(self.original).convert("RGBA").convert("RGBa"),
            mask=ImageOps.invert(Image.fromarray(self.soft, "L")),
        )
        keep = keep.convert("RGBA")
        return np.stack([self._one(Image.fromarray(image), keep) for image in pixels])

    def _one(self, image: Image.Image, keep: Image.Image) -> np.ndarray:
        x1, y1, x2, y2 = self.box
        if (x1, y1, x2, y2) != (0, 0, keep.width, keep.height):
            placed = Image.new("RGBA", keep.size)
            placed.paste(fit(image, y2 - y1, x2 - x1), (x1, y1))  # diffusers' resize_mode="crop" into the box
            image = placed.convert("RGB")
        image = image.convert("RGBA")
        image.alpha_composite(keep)
        return np.asarray(image.convert("RGB"), np.uint8)
