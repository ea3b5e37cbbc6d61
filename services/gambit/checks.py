"""Range checks for configs: the error names the value that is wrong and what it was ("steps must be
>= 1, got 0"), where a grouped message ("steps, batch_size and lr must be positive") left users to guess."""

from __future__ import annotations


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
