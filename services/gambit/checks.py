"""Range checks for configs: the error names the value that is wrong and what it was ("steps must be
>= 1, got 0"), where a grouped message ("steps, batch_size and lr must be positive") left users to guess."""

from __future__ import annotations

import math


def at_least(low: float, **values: float) -> None:
    """Each value ``>= low``; else ValueError naming the first that is not (NaN is not)."""
    for name, v in values.items():
        if not v >= low:
            raise ValueError(f"{name} must be >= {low}, got {v!r}")


def above(low: float, **values: float) -> None:
    """Each value ``> low``; else ValueError naming the first that is not (NaN is not)."""
    for name, v in values.items():
        if not v > low:
            raise ValueError(f"{name} must be > {low}, got {v!r}")


def finite(**values: float) -> None:
    """Each value a number that is not NaN or infinite (an inf passes ``at_least``); else ValueError
    naming the first that is not."""
    for name, v in values.items():
        if not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")


def within(low: float, high: float, **values: float) -> None:
    """Each value in ``[low, high]``; else ValueError naming the first that is not (NaN is not)."""
    for name, v in values.items():
        if not low <= v <= high:
            raise ValueError(f"{name} must be in [{low}, {high}], got {v!r}")
