"""Outpainting: the picture grown by some pixels on each side, the new border inpainted, the picture kept exactly.

    sides = read_sides("left=128 right=128")             # Sides(left=128, right=128, up=0, down=0)
    canvas, repaint = grown(picture, sides, height, width, blur)   # what the engine inpaints, at the request's size
    soft = outpaint_mask(sides, height, width, blur)     # the overlay's mask (`overlay.py`)

The request's size is the grown canvas, as every size one the server offers (nothing compiles). The picture is
fitted (diffusers' crop fit, as image to image) to the canvas less the sides' pixels and placed at (left, up); the
sides are Fooocus's directions and A1111's "Outpainting mk2" pixels. The new area is filled with the picture's edge
colours, stretched outwards and blurred (not noise): the engine starts from the picture's latents at a strength
below 1, and a fill of the edge's own colours carries on its light and hue where noise would encode to a grey,
speckled start that only strength 1 hides (A1111 asks mk2 for a denoising strength of 0.8 and more); it is also the
same for every seed. The mask is mk2's: the kept rectangle shrunk by `mask_blur` pixels on each grown side, then
blurred by `mask_blur`, so the seam is redrawn and blended; the overlay then pastes the picture back, so its pixels
beyond that band come back bit for bit. Host-side numpy and Pillow, no JAX.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from .errors import InvalidInput
from .fields import echo
from .image_inputs import fit
from .overlay import soft_mask

#: The sides by name as a request writes them, with the other names people use (Fooocus's Top and Bottom).
SIDE_NAMES = {"left": "left", "right": "right", "up": "up", "down": "down", "top": "up", "bottom": "down"}
#: Most pixels one side may add (the largest SDXL sizes are 2048 wide).
MAX_SIDE = 2048
#: Fewest pixels of the picture the canvas keeps each way (one latent cell).
MIN_KEPT = 8
#: The fill's blur, as a part of the widest side's pixels: wide enough to smooth the stretched edge's streaks.
FILL_BLUR = 0.25
_PAIR = re.compile(r"\s*([a-z]+)\s*[=:]\s*(-?\d+)\s*")


@dataclass(frozen=True)
class Sides:
    """Pixels added on each side of the picture (0: none)."""

    left: int = 0
    right: int = 0
    up: int = 0
    down: int = 0

    def __bool__(self) -> bool:
        return any((self.left, self.right, self.up, self.down))

    @property
    def text(self) -> str:
        """As a request and `parameters` write it: "left=128 right=128" ("" for none)."""
        return " ".join(
            f"{name}={getattr(self, name)}" for name in ("left", "right", "up", "down") if getattr(self, name)
        )


def read_sides(text: object) -> Sides:
    """ "left=128 right=128" (commas allowed; top/bottom for up/down) -> Sides; None or "" -> none. One sentence for
    anything else: an unknown side, a side twice, negative or too many pixels."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return Sides()
    example = "e.g. 'left=128 right=128' (sides: left, right, up, down)"
    if not isinstance(text, str):
        raise InvalidInput(f"outpaint must be text, {example}; got a value of type {type(text).__name__}.")
    found: dict[str, int] = {}
    for part in re.split(r"[,;\s]+(?=[a-zA-Z])", text.strip()):
        match = _PAIR.fullmatch(part.lower())
        side = SIDE_NAMES.get(match[1]) if match else None
        if side is None:
            raise InvalidInput(f"outpaint {echo(text)} is not understood; write the pixels per side, {example}.")
        if side in found:
            raise InvalidInput(f"outpaint names the {side} side twice ({echo(text)}); give each side once.")
        pixels = int(match[2])
        if not 0 <= pixels <= MAX_SIDE:
            raise InvalidInput(
                f"outpaint's {side} side must be a whole number of pixels from 0 to {MAX_SIDE}; got {pixels}."
            )
        found[side] = pixels
    return Sides(**found)


def check_room(sides: Sides, height: int, width: int, offered: Iterable[tuple[int, int]]) -> None:
    """The canvas (the request's size) must keep at least MIN_KEPT pixels of the picture each way; otherwise one
    sentence naming the offered sizes that would (or that none does)."""
    if width - sides.left - sides.right >= MIN_KEPT and height - sides.up - sides.down >= MIN_KEPT:
        return
    roomy = [
        f"{w}×{h}"
        for h, w in offered
        if w - sides.left - sides.right >= MIN_KEPT and h - sides.up - sides.down >= MIN_KEPT
    ]
    then = f"sizes that would: {', '.join(roomy)}" if roomy else "no size this server offers does; add fewer pixels"
    raise InvalidInput(
        f"Outpainting {sides.text} leaves no room for the picture in {width}×{height} (the canvas keeps at least "
        f"{MIN_KEPT} pixels of it each way); {then}."
    )


def _kept_box(sides: Sides, height: int, width: int) -> tuple[int, int, int, int]:
    """(x1, y1, x2, y2) of the picture in the canvas."""
    return sides.left, sides.up, width - sides.right, height - sides.down


def outpaint_mask(sides: Sides, height: int, width: int, blur: int) -> np.ndarray:
    """The overlay's mask, uint8 [height, width] (255 = repaint): the canvas but the picture's rectangle, which is
    shrunk by `blur` pixels on each grown side (A1111's mk2) and then blurred by `blur`."""
    x1, y1, x2, y2 = _kept_box(sides, height, width)
    keep = np.zeros((height, width), bool)
    keep[
        y1 + (blur if sides.up else 0) : y2 - (blur if sides.down else 0),
        x1 + (blur if sides.left else 0) : x2 - (blur if sides.right else 0),
    ] = True
    return soft_mask(~keep, blur)


def grown(picture: Image.Image, sides: Sides, height: int, width: int, blur: int) -> tuple[np.ndarray, np.ndarray]:
    """The canvas the engine inpaints, uint8 [height, width, 3]: the picture fitted into its rectangle, the new area
    its edge colours stretched out and blurred; and the repaint mask, bool [height, width] (the overlay's, binarized
    at 0.5 as every mask is)."""
    x1, y1, x2, y2 = _kept_box(sides, height, width)
    kept = np.asarray(fit(picture, y2 - y1, x2 - x1), np.uint8)  # [y2 - y1, x2 - x1, 3]
    stretched = np.pad(kept, ((y1, height - y2), (x1, width - x2), (0, 0)), mode="edge")  # [height, width, 3]
    radius = FILL_BLUR * max(sides.left, sides.right, sides.up, sides.down)
    canvas = np.asarray(Image.fromarray(stretched).filter(ImageFilter.GaussianBlur(radius)), np.uint8).copy()
    canvas[y1:y2, x1:x2] = kept
    return canvas, outpaint_mask(sides, height, width, blur) >= 128
