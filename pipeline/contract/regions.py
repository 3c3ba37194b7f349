"""Regional prompts (Regional Prompter's Attention mode) at the request edge: where each part of the prompt acts.

A request's `regions` is Regional Prompter's divide syntax, or a painted mask (`region_mask`, one colour per region):

    columns 1,1          two columns of equal width, left to right
    rows 1,2             two rows, the lower twice as tall
    columns 1,1;1,2,1    rows of columns: each `;` group a row, its first number the row's height, the rest its
                         columns' widths (Regional Prompter's "1,2,1,1;2,4,6"); `rows ...;...` the same turned,
                         each group a column split into rows

The prompt's parts are split on BREAK. With `region_base` r > 0 the first part is the base (everywhere) and the
others are the regions in order; with r = 0 every part is a region. A painted mask's regions are its colours other
than black (or transparent), in the order they first appear reading the picture row by row. Each refusal is one
sentence. No JAX, no engine: the page and the CLI import it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .errors import InvalidInput
from .fields import echo

#: Regional Prompter's divide modes as `parameters` writes them (`RP Divide mode`).
MODES = {"columns": "Columns", "rows": "Rows"}
#: What `RP Divide mode` says of a painted mask.
MASK_MODE = "Mask"
#: The most regions one request draws (a painted mask's colours beyond it are refused).
MAX_REGIONS = 16
_SPEC = re.compile(r"^\s*(columns|rows)\s+(.+?)\s*$", re.IGNORECASE)
#: A1111's prompt separator: a word of its own, upper case (host/planning/emphasis.py reads it the same way).
_BREAK = re.compile(r"\bBREAK\b")
#: (top, left, bottom, right) as fractions of the picture's height and width.
Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class RegionLayout:
    """Where a request's regions are: boxes from the divide syntax, or a painted mask's labels."""

    mode: str  # "Columns", "Rows" or "Mask" (RP Divide mode)
    ratios: str  # the divide syntax's numbers as written ("1,1;1,2,1"); "" for a mask
    boxes: tuple[Box, ...] = ()  # each region's box, in order (the divide syntax)
    labels: np.ndarray | None = None  # int16 [H, W]: each pixel's region, -1 none (a painted mask)

    @property
    def count(self) -> int:
        """The regions drawn."""
        return len(self.boxes) if self.labels is None else int(self.labels.max()) + 1

    def cover(self, height: int, width: int) -> np.ndarray:
        """bool [regions, height·width]: which cells of a height × width grid each region holds, a cell being held
        when its centre lies inside the region (the grid of one of the UNet's attention layers)."""
        ys = (np.arange(height) + 0.5) / height  # each cell's centre, as a fraction of the picture
        xs = (np.arange(width) + 0.5) / width
        if self.labels is not None:
            rows = np.minimum((ys * self.labels.shape[0]).astype(int), self.labels.shape[0] - 1)
            columns = np.minimum((xs * self.labels.shape[1]).astype(int), self.labels.shape[1] - 1)
            sampled = self.labels[np.ix_(rows, columns)]  # [height, width]
            return np.stack([(sampled == region).ravel() for region in range(self.count)])
        y, x = np.meshgrid(ys, xs, indexing="ij")
        return np.stack(
            [((top <= y) & (y < bottom) & (left <= x) & (x < right)).ravel() for top, left, bottom, right in self.boxes]
        )


def parse_divide(text: str) -> RegionLayout:
    """`columns 1,1`, `rows 1,2`, `columns 1,1;1,2,1` -> its boxes; one sentence for anything else."""
    match = _SPEC.match(text)
    if match is None:
        raise InvalidInput(
            f"regions {echo(text)} is not Regional Prompter's divide syntax; write e.g. 'columns 1,1', 'rows 1,2' "
            "or 'columns 1,1;1,2,1'."
        )
    mode, numbers = MODES[match.group(1).lower()], match.group(2).replace(" ", "")
    groups = [[_ratio(value, text) for value in group.split(",")] for group in numbers.split(";")]
    if len(groups) == 1:  # one split along the mode's axis
        spans = [(0.0, 1.0, *span) for span in _spans(groups[0])]
    else:  # each group: its own size along the other axis, then its split
        outer = _spans([group[0] for group in groups])
        spans = []
        for (start, end), group in zip(outer, groups, strict=True):
            spans += [(start, end, *span) for span in _spans(group[1:] or [1.0])]
    if mode == "Columns":  # (row span, column span)
        boxes = tuple((top, left, bottom, right) for top, bottom, left, right in spans)
    else:
        boxes = tuple((top, left, bottom, right) for left, right, top, bottom in spans)
    if len(boxes) > MAX_REGIONS:
        raise InvalidInput(f"regions {echo(text)} draws {len(boxes)} regions; at most {MAX_REGIONS}.")
    return RegionLayout(mode, numbers, boxes)


def _ratio(value: str, text: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise InvalidInput(f"Region ratios must be positive numbers; got {echo(value)} in {echo(text)}.")
    return number


def _spans(ratios: list[float]) -> list[tuple[float, float]]:
    """Ratios -> consecutive (start, end) fractions of 1."""
    edges = np.concatenate([[0.0], np.cumsum(ratios) / np.sum(ratios)])
    return [(float(edges[i]), float(edges[i + 1])) for i in range(len(ratios))]


def parse_mask(picture: Image.Image, height: int, width: int) -> RegionLayout:
    """A painted mask at the request's size -> one region per colour other than black (transparent counts as black),
    in the order the colours first appear reading row by row."""
    if picture.size != (width, height):
        raise InvalidInput(
            f"The region mask is {picture.size[0]}×{picture.size[1]} but the picture is {width}×{height}; paint it "
            "at the request's size."
        )
    rgba = np.asarray(picture.convert("RGBA"))
    colours = rgba[..., :3].astype(np.int32) @ np.asarray([1 << 16, 1 << 8, 1], np.int32)  # [H, W]
    colours = np.where(rgba[..., 3] < 128, 0, colours)
    found, first = np.unique(colours.ravel(), return_index=True)
    order = [colour for _, colour in sorted(zip(first, found, strict=True)) if colour != 0]
    if not order:
        raise InvalidInput("The region mask has no painted region: paint each region in its own colour on black.")
    if len(order) > MAX_REGIONS:
        raise InvalidInput(f"The region mask has {len(order)} colours; at most {MAX_REGIONS} regions.")
    labels = np.full(colours.shape, -1, np.int16)
    for region, colour in enumerate(order):
        labels[colours == colour] = region
    return RegionLayout(MASK_MODE, "", labels=labels)


def mask_layout(png: bytes) -> RegionLayout:
    """A request's region mask (PNG bytes, already checked at its size) as its layout."""
    picture = Image.open(io.BytesIO(png))
    return parse_mask(picture, picture.size[1], picture.size[0])


#: The most parts a server may compile regional prompts for (--region-parts).
MAX_PARTS = 8


def parse_part_counts(text: str) -> tuple[int, ...]:
    """`--region-parts 2-4` (or `2,3`, `none`) -> (2, 3, 4): the part counts compiled beyond one (one part runs the
    plain programs); one sentence for anything else."""
    counts: list[int] = []
    for piece in str(text or "").replace(" ", "").split(","):
        if piece in ("", "none", "1"):
            continue
        low, _, high = piece.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            first = last = 0
        if not 1 <= first <= last <= MAX_PARTS:
            raise InvalidInput(f"--region-parts takes counts from 1 to {MAX_PARTS}, e.g. 2-4 or 2,3; got {piece!r}.")
        counts += [count for count in range(max(first, 2), last + 1) if count not in counts]
    return tuple(sorted(counts))


def split_parts(prompt: str) -> list[str]:
    """A prompt's parts, split on BREAK (emphasis and all, as written)."""
    return [part.strip() for part in _BREAK.split(prompt)]


def prompt_parts(prompt: str) -> int:
    """The parts of a prompt, split on BREAK."""
    return len(split_parts(prompt))


def check_parts(layout: RegionLayout, base: float, prompt: str, offered: tuple[int, ...]) -> int:
    """The parts a regional request runs (its regions, and the base with `base` > 0), checked against the prompt's
    BREAKs and the part counts the server compiled (`offered`, --region-parts; one part runs the plain programs)."""
    parts = layout.count + (1 if base > 0 else 0)
    if parts > 1 and parts not in offered:
        if not offered:
            raise InvalidInput(
                f"This server compiles no regional prompts of several parts (--region-parts); this one has {parts}."
            )
        served = ", ".join(map(str, (1, *offered)))
        raise InvalidInput(
            f"This server's regional prompts have {served} parts (--region-parts); this one has {parts}."
        )
    written = prompt_parts(prompt)
    if written != parts:
        with_base = " and the base (region_base > 0)" if base > 0 else ""
        raise InvalidInput(
            f"The prompt has {written} part{'s' if written != 1 else ''} split on BREAK, but {layout.count} "
            f"region{'s' if layout.count != 1 else ''}{with_base} need {parts}."
        )
    return parts
