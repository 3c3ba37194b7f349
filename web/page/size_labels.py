"""The page's names for the offered sizes: '1344×768 (16:9)' (a request may send the label back as it is)."""

from __future__ import annotations

import math

#: Named ratios used for labels: the nearest one within RATIO_TOLERANCE names a size (1344×768 -> 16:9, 1.6 % off);
#: a size near none of them is labelled with its own reduced ratio (160×96 -> 5:3, not 16:9).
NAMED_RATIOS = ((1, 1), (5, 4), (4, 3), (3, 2), (16, 9), (21, 9))
RATIO_TOLERANCE = 1.03


def ratio_name(height: int, width: int) -> str:
    """'16:9' for 1344×768 (the nearest named ratio within 3 %), else the reduced fraction ('5:3' for 160×96)."""
    actual = width / height
    best = None
    for a, b in NAMED_RATIOS:
        for w, h in ((a, b), (b, a)):
            error = abs(math.log(actual / (w / h)))
            if error < math.log(RATIO_TOLERANCE) and (best is None or error < best[0]):
                best = (error, f"{w}:{h}")
    if best:
        return best[1]
    g = math.gcd(width, height)
    return f"{width // g}:{height // g}"


def size_label(height: int, width: int) -> str:
    """The dropdown label of a size, e.g. '1344×768 (16:9)'."""
    return f"{width}×{height} ({ratio_name(height, width)})"
