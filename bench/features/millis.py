"""Milliseconds of repeated measurements, with the 90th percentile the feature parts quote (bench/common.Stats keeps
seconds and the 95th)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Millis:
    """Summary of repeated measurements, in milliseconds."""

    n: int  # number of measurements
    median: float  # the figure the tables quote
    p90: float  # 90th percentile (nearest rank); equals max for n < 10
    min: float  # fastest
    max: float  # slowest

    @classmethod
    def of_seconds(cls, seconds: Sequence[float]) -> Millis:
        """Summarise durations given in seconds (NaNs when there are none)."""
        return cls.of([s * 1000 for s in seconds])

    @classmethod
    def of(cls, millis: Sequence[float]) -> Millis:
        """Summarise durations given in milliseconds (NaNs when there are none)."""
        if not millis:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan)
        ordered = sorted(millis)
        rank = max(0, math.ceil(0.9 * len(ordered)) - 1)  # nearest-rank percentile
        return cls(len(ordered), statistics.median(ordered), ordered[rank], ordered[0], ordered[-1])

    def text(self, digits: int = 1) -> str:
        """'median (p90 x; min–max)' for tables."""
        d = digits
        return f"{self.median:.{d}f} (p90 {self.p90:.{d}f}; {self.min:.{d}f}–{self.max:.{d}f})"
