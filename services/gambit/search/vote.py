"""Answer aggregation over a pool of traces."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most common non-empty answer; ties go to the answer reached first (deterministic)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def weighted_vote(answers: Sequence[str | None], weights: Sequence[float]) -> str | None:
    """Answer with the largest total weight (score-weighted vote); ties to the first reached. A weight
    that is not finite counts as 0, as an unscored trace does: one NaN made the vote raise StopIteration."""
    totals: dict[str, float] = {}
    for a, w in zip(answers, weights, strict=True):
        if a is not None:
            w = float(w)
            totals[a] = totals.get(a, 0.0) + (w if math.isfinite(w) else 0.0)
    if not totals:
        return None
    best = max(totals.values())
    return next(a for a in answers if a is not None and totals[a] == best)


def vote_counts(votes: dict, top: int | None = None, empty: str = "none") -> str:
    """``{"15": 3, "80": 8}`` as ``80 ×8, 15 ×3``: most votes first (ties in the order the answers came),
    the first ``top`` of them; how the live view and the lineage summary show a vote."""
    ranked = sorted(votes.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{a} ×{n}" for a, n in ranked) or empty
