"""Regional prompts' stage of the run plan: each attention grid's blend weights, from the request's regions.

Every cross-attention of the UNet attends to each part of the prompt (77 tokens each, side by side) from the same
queries and blends the parts' outputs per cell (`device/regions.py`). A cell belongs to a region when its centre lies
inside it; where regions overlap their outputs are averaged. With base ratio r > 0 the first part is the base:
out = r·base + (1 − r)·regions, and the base alone covers what no region covers; with r = 0 a cell no region covers
(a painted mask's black) takes the first part. The weights of each grid the UNet attends at (the latents', then
halved per down block) are made here on the host, float32 [parts, cells] each, and travel as the step's argument:
a new layout never compiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...contract.errors import InvalidInput
from ...contract.regions import RegionLayout, split_parts
from .tokens import CHUNK, ExtraRows


@dataclass(frozen=True)
class RegionPlan:
    """A regional request's blend (None on a plan without regions of several parts)."""

    parts: int  # the prompt's parts (P): a ProgramKey field, compiled at start-up (--region-parts)
    weights: tuple[np.ndarray, ...]  # float32 [P, h·w] per attention grid, the latents' first (`attention_grids`)


def attention_grids(height: int, width: int, levels: int) -> tuple[tuple[int, int], ...]:
    """The (rows, columns) of the latents (`height` × `width`) and of each down block's halving after it (a stride-2
    convolution with padding 1: ceil), `levels` grids in all: where the UNet's attention layers run."""
    grids = [(height, width)]
    for _ in range(levels - 1):
        height, width = -(-height // 2), -(-width // 2)
        grids.append((height, width))
    return tuple(grids)


def blend_weights(layout: RegionLayout, base: float, height: int, width: int) -> np.ndarray:
    """float32 [parts, height·width]: each part's share of each cell of a height × width grid (every column sums
    to 1)."""
    cover = layout.cover(height, width).astype(np.float64)  # [regions, cells]
    held = cover.sum(axis=0)  # regions holding each cell
    shares = cover / np.maximum(held, 1)  # overlaps averaged
    if base > 0:
        weights = np.concatenate([np.where(held > 0, base, 1.0)[None], (1 - base) * shares])
    else:
        weights = shares
        weights[0] += held == 0  # a cell no region holds: the first part's
    return weights.astype(np.float32)


def region_plan(layout: RegionLayout | None, base: float, latent_size: tuple[int, int], levels: int):
    """The blend of a request's `layout` with base ratio `base` at latents of `latent_size`, over the UNet's
    `levels` grids; None without regions, or with one part (the plain programs run: one part everywhere is plain
    attention)."""
    if layout is None:
        return None
    parts = layout.count + (1 if base > 0 else 0)
    if parts == 1:
        return None
    grids = attention_grids(*latent_size, levels)
    return RegionPlan(parts, tuple(blend_weights(layout, base, rows, columns) for rows, columns in grids))


def check_part_lengths(reader, prompt: str, negative: str) -> None:
    """Each part of a regional prompt is read in one 77-token window (a longer one is refused, not chunked: its
    windows would no longer line up with the regions), and the negative prompt, the same for every part, too."""
    for number, piece in enumerate(split_parts(prompt), start=1):
        if reader.read(piece, 1, ExtraRows()).overflow:
            raise InvalidInput(
                f"Part {number} of the regional prompt is longer than {CHUNK} tokens; each part is read in one "
                "77-token window: shorten it."
            )
    if reader.read(negative, 1, ExtraRows()).overflow:
        raise InvalidInput(
            f"With regions the negative prompt is read in one 77-token window for every part; shorten it to "
            f"{CHUNK} tokens."
        )
