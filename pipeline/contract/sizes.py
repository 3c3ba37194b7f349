"""The image sizes a server offers: SDXL's trained aspect ratios and `--sizes` parsing (a request's choice among
them: `fields.check_size`; the page's labels: `web/page/size_labels.py`).

Sizes are written width×height (the usual image notation) in text and
handled as (height, width) tuples in code, like the engine's shapes.
"""

from __future__ import annotations

import re

from .errors import InvalidInput

#: SDXL's trained resolutions (width, height), square first: `--sizes sdxl` offers all nine.
SDXL_SIZES_WH = (
    (1024, 1024),
    (1152, 896),
    (896, 1152),
    (1216, 832),
    (832, 1216),
    (1344, 768),
    (768, 1344),
    (1536, 640),
    (640, 1536),
)
#: The default offer: square, landscape 16:9 and portrait 9:16. Each size is one more program to compile at start-up
#: (on this project's 2-core CPU ~20 s each for the tiny model; minutes each for SDXL), so three, not nine.
DEFAULT_SIZES_WH = ((1024, 1024), (1344, 768), (768, 1344))
#: The `--sizes` keyword for all of SDXL_SIZES_WH.
ALL_SDXL_SIZES = "sdxl"
#: --model tiny offers the same ratios with a 128 px short side, the long side rounded to TINY_MULTIPLE (its UNet
#: halves the latents twice, so sides must be multiples of 8 x 4 = 32 px; SDXL's own sizes are multiples of 64).
TINY_SHORT_SIDE = 128
TINY_MULTIPLE = 32
#: Every side must be a multiple of this: the VAE divides by 8 and the UNet halves the latents twice (8 × 4).
SIZE_MULTIPLE = 32
#: The longest side a size may have: this server's bound (SDXL was trained at about 1024 px), said in every refusal.
MAX_SIDE = 4096

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
        if not (SIZE_MULTIPLE <= width <= MAX_SIDE and SIZE_MULTIPLE <= height <= MAX_SIDE) or (
            width % SIZE_MULTIPLE or height % SIZE_MULTIPLE
        ):
            raise InvalidInput(
                f"Each side of a size must be a multiple of {SIZE_MULTIPLE} from {SIZE_MULTIPLE} to {MAX_SIDE}; "
                f"got {part}."
            )
        if (height, width) not in sizes:
            sizes.append((height, width))
    return sizes
