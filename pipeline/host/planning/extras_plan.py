"""What a request adds to its base UNet's steps: FreeU's factors and PAG's scale, one row of numbers per plan row.

    extras = extras_plan(request, plan)     # None: neither; else the programs' `extras` and [plan rows, 5]
    extras.kinds                            # ("freeu",), ("pag",) or ("freeu", "pag"): ProgramKey.extras
    extras.rows[index]                      # b1, b2, s1, s2, the PAG scale at that row's timestep

PAG's scale per step is diffusers' `PAGMixin._get_pag_scale(t)`: `pag_scale − pag_adaptive_scale × (1000 − t)`, not
below 0, at the row's timestep t (a float, as the scheduler's); FreeU's factors are the same on every row (1 where
it is off: the columns are read only by a program that runs FreeU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...contract.request import Request, asks_for_extras
from ...device.extras_step import EXTRAS
from .sampler_plan import COEFFICIENTS, Plan

#: diffusers' constant in `_get_pag_scale` (not the scheduler's train steps).
PAG_TIMESTEPS = 1000


@dataclass(frozen=True)
class UNetExtras:
    """A request's FreeU and PAG, per plan row."""

    kinds: tuple[str, ...]  # static: the step programs' `ProgramKey.extras`
    rows: np.ndarray  # float32 [plan rows, 5]: `device/extras_step.EXTRAS` per row


def extras_plan(request: Request, plan: Plan) -> UNetExtras | None:
    """`request`'s FreeU and PAG on `plan`'s rows (None when it asks for neither)."""
    kinds = asks_for_extras(request.plain_values())
    if not kinds:
        return None
    factors = [float(part) for part in request.freeu.split(",")] if request.freeu else [1.0] * 4
    timesteps = np.asarray(plan.coefficients, np.float64)[..., COEFFICIENTS.index("timestep")]  # [rows]
    pag = np.maximum(request.pag_scale - request.pag_adaptive_scale * (PAG_TIMESTEPS - timesteps), 0.0)
    rows = np.zeros((len(timesteps), len(EXTRAS)), np.float32)
    rows[:, :4] = factors
    rows[:, 4] = pag if request.pag_scale > 0 else 0.0
    return UNetExtras(kinds, rows)
