"""How a request uses its mask: the whole picture (diffusers' inpainting), only the masked area, or outpainting.

    use = MaskUse.of(values)                                      # the request's outpaint, mask_blur, inpaint_area ...
    inputs = prepare_pictures(image, mask, strength, use=use, height=H, width=W, steps=n, offered=sizes)
    pixels, repaint, paste = arranged(inputs.pixels, inputs.repaint, use)   # what the engine inpaints; the overlay

The request carries the picture and the mask at its size (`init_image`, `mask_image`: for outpainting the grown
canvas and its mask, `outpaint.py`); `arranged` turns them into what the engine runs (inpaint only masked: the box
scaled to the size, `inpaint_crop.py`) and the `Paste` that lays the result back (`overlay.py`). The leader and a
follower (or the engine service) call it on the same arrays, so both run the same picture. Plain inpainting is
diffusers' output as it was, unless the request asks for A1111's overlay (`inpaint_overlay`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .errors import InvalidInput
from .fields import FIELD
from .image_inputs import ImageInputs, ImageSource, latent_mask, open_image, prepare_image_inputs, steps_to_run, to_rgb
from .inpaint_crop import crop_box, cropped
from .outpaint import Sides, check_room, grown, outpaint_mask, read_sides
from .overlay import Paste, soft_mask


@dataclass(frozen=True)
class MaskUse:
    """A request's mask settings, checked (the table's rows and `outpaint`)."""

    outpaint: Sides = Sides()
    blur: int = 4  # mask_blur: the overlay's soft edge, in pixels
    only_masked: bool = False  # inpaint_area "Only masked"
    padding: int = 32  # only_masked_padding
    overlay: bool = False  # inpaint_overlay "on" (whole-picture inpainting)

    @classmethod
    def of(cls, values: Mapping[str, object], outpaint: object = None) -> MaskUse:
        """From the request's values by field name (`outpaint` as text, else `values["outpaint"]`)."""
        return cls(
            outpaint=read_sides(values.get("outpaint", "") if outpaint is None else outpaint),
            blur=int(values.get("mask_blur", 4)),
            only_masked=values.get("inpaint_area") == "Only masked",
            padding=int(values.get("only_masked_padding", 32)),
            overlay=values.get("inpaint_overlay") == "on",
        )

    def pastes(self, has_mask: bool) -> bool:
        """Whether the result is overlaid on the picture: outpainting always, a mask's only masked or overlay."""
        return bool(self.outpaint) or (has_mask and (self.only_masked or self.overlay))

    def settings(self, has_mask: bool) -> dict[str, object]:
        """The `parameters` keys of how the mask was used, after `Denoising strength` as A1111 orders them: `Mask
        blur` when the result is overlaid, `Inpaint area: Only masked` and `Masked area padding`, `Outpaint`, and the
        overlay of whole-picture inpainting (the last two this project's own)."""
        if not self.pastes(has_mask):
            return {}
        written: dict[str, object] = {"Mask blur": self.blur}
        if self.outpaint:
            written["Outpaint"] = self.outpaint.text
        elif self.only_masked:
            written.update({"Inpaint area": "Only masked", "Masked area padding": self.padding})
        else:
            written["Inpaint overlay"] = "on"
        return written


def prepare_pictures(
    image: ImageSource | None,
    mask: ImageSource | None,
    strength: object,
    *,
    use: MaskUse,
    height: int,
    width: int,
    steps: int,
    offered: Iterable[tuple[int, int]],
) -> ImageInputs | None:
    """`image_inputs.prepare_image_inputs`; with outpainting, the grown canvas and its own mask instead."""
    if not use.outpaint:
        return prepare_image_inputs(image, mask, strength, height=height, width=width, steps=steps)
    if image is None:
        raise InvalidInput("Outpainting needs a picture to grow; add the picture or leave outpaint empty.")
    if mask is not None:
        raise InvalidInput("Outpainting makes its own mask (the new border); remove the mask or leave outpaint empty.")
    if use.only_masked:
        raise InvalidInput("Outpainting redraws the border around the picture: set inpaint_area to whole with it.")
    check_room(use.outpaint, height, width, offered)
    number = FIELD["strength"].check(strength)
    run = steps_to_run(steps, number)
    picture = to_rgb(open_image(image, what="image"))
    canvas, repaint = grown(picture, use.outpaint, height, width, use.blur)
    return ImageInputs(canvas, repaint, latent_mask(repaint), number, run, source_size=picture.size)


def arranged(
    pixels: np.ndarray, repaint: np.ndarray | None, use: MaskUse
) -> tuple[np.ndarray, np.ndarray | None, Paste | None]:
    """The request's picture (uint8 [H, W, 3]) and mask (bool [H, W] or None) -> what the engine inpaints (the same
    size) and how its result is overlaid (None: returned as the engine made it)."""
    height, width = pixels.shape[:2]
    whole = (0, 0, width, height)
    if use.outpaint:
        return pixels, repaint, Paste(pixels, outpaint_mask(use.outpaint, height, width, use.blur), whole)
    if repaint is None or not (use.only_masked or use.overlay):
        return pixels, repaint, None
    soft = soft_mask(repaint, use.blur)
    if not use.only_masked:
        return pixels, repaint, Paste(pixels, soft, whole)
    box = crop_box(repaint, use.padding, width, height)
    inner, inner_repaint = cropped(pixels, repaint, box, width, height)
    return inner, inner_repaint, Paste(pixels, soft, box)
