"""Reference code the tests compare the engine with: not served, so kept out of the engine's modules."""

from __future__ import annotations

import numpy as np

from pipeline.image_inputs import ImageSource, fit, open_image, to_rgb


def prepare_image(source: ImageSource, height: int, width: int) -> np.ndarray:
    """Decode, convert and fit an init image: uint8 [height, width, 3]."""
    return np.asarray(fit(to_rgb(open_image(source, what="image")), height, width), dtype=np.uint8).copy()
