"""The image sizes a server offers: SDXL's trained aspect ratios, `--sizes` parsing, labels, and the user's choice.

Kept free of JAX so the UI can import it. Sizes are written width×height (the usual image notation) in text and
handled as (height, width) tuples in code, like the engine's shapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from .validation import InvalidInput

#: SDXL's trained resolutions (width, height), square first: `--sizes sdxl` offers all nine.
SDXL_SIZES_WH = (
    (1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216),
    (1344, 768), (768, 1344), (1536, 640), (640, 1536),
)  # fmt: skip
#: The default offer: square, landscape 16:9 and portrait 9:16. Each size is one more program to compile at start-up
#: (on this project's 2-core CPU ~20 s each for the tiny model; minutes each for SDXL), so three, not nine.
DEFAULT_SIZES_WH = ((1024, 1024), (1344, 768), (768, 1344))
#: The `--sizes` keyword for all of SDXL_SIZES_WH.
ALL_SDXL_SIZES = "sdxl"
#: --model tiny offers the same ratios with a 128 px short side, the long side rounded to TINY_MULTIPLE (its UNet
#: halves the latents twice, so sides must be multiples of 8 x 4 = 32 px; SDXL's own sizes are multiples of 64).
TINY_SHORT_SIDE = 128
TINY_MULTIPLE = 32
#: Named ratios used for labels: the nearest one within RATIO_TOLERANCE names a size (1344×768 -> 16:9, 1.6 % off);
#: a size near none of them is labelled with its own reduced ratio (160×96 -> 5:3, not 16:9).
NAMED_RATIOS = ((1, 1), (5, 4), (4, 3), (3, 2), (16, 9), (21, 9))
RATIO_TOLERANCE = 1.03
#: Every side must be a multiple of this: the VAE divides by 8 and the UNet halves the latents twice (8 × 4).
SIZE_MULTIPLE = 32

Size = tuple[int, int]  # (height, width)


def default_sizes(tiny: bool = False, every: bool = False) -> list[Size]:
    """The default sizes (all nine of SDXL's with `every`) as (height, width); for the tiny model the same ratios at
    ~128 px (see TINY_SHORT_SIDE)."""
    offer = SDXL_SIZES_WH if every else DEFAULT_SIZES_WH
    if not tiny:
        return [(h, w) for w, h in offer]
    sizes = []
    for w, h in offer:
        long = round(TINY_SHORT_SIDE * max(w, h) / min(w, h) / TINY_MULTIPLE) * TINY_MULTIPLE
        sizes.append((TINY_SHORT_SIDE, long) if w >= h else (long, TINY_SHORT_SIDE))
    return sizes


def parse_sizes(text: str, tiny: bool = False) -> list[Size]:
    """'1024x1024,1344x768' -> [(1024, 1024), (768, 1344)]; 'sdxl' -> SDXL's nine sizes (scaled for `tiny`); one
    clear InvalidInput for anything else."""
    if str(text).strip().lower() == ALL_SDXL_SIZES:
        return default_sizes(tiny=tiny, every=True)
    sizes: list[Size] = []
    for part in (p.strip() for p in str(text).split(",")):
        match = re.fullmatch(r"(\d{1,5})\s*[x×]\s*(\d{1,5})", part)
        if not match:
            raise InvalidInput(
                f"Sizes are written WIDTHxHEIGHT, comma-separated (e.g. 1024x1024,1344x768); got {part!r}."
            )
        width, height = int(match[1]), int(match[2])
        if not (SIZE_MULTIPLE <= width <= 4096 and SIZE_MULTIPLE <= height <= 4096) or (
            width % SIZE_MULTIPLE or height % SIZE_MULTIPLE
        ):
            raise InvalidInput(
                f"Each side of a size must be a multiple of {SIZE_MULTIPLE} from {SIZE_MULTIPLE} to 4096; got {part}."
            )
        if (height, width) not in sizes:
            sizes.append((height, width))
    return sizes


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


def check_size(value: object, sizes: Sequence[Size]) -> Size:
    """The (height, width) a user chose: a label from `size_label` or 'WxH'; None means the first (default) size."""
    if value is None or value == "":
        return tuple(sizes[0])
    if isinstance(value, str):
        for height, width in sizes:
            if value == size_label(height, width):
                return (height, width)
        match = re.fullmatch(r"\s*(\d{1,5})\s*[x×]\s*(\d{1,5})\s*(\(.*\))?\s*", value)
        if match and (int(match[2]), int(match[1])) in [tuple(s) for s in sizes]:
            return (int(match[2]), int(match[1]))
    shown = value if isinstance(value, str) else type(value).__name__
    if isinstance(shown, str) and len(shown) > 40:
        shown = shown[:39] + "…"
    offered = ", ".join(f"{w}×{h}" for h, w in sizes)
    raise InvalidInput(f"Aspect ratio {shown!r} is not offered by this server; choose one of: {offered}.")
