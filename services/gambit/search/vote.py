"""Answer aggregation over a pool of traces."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def majority_vote(answers: Sequence[str | None], tiebreak: Sequence[float] | None = None) -> str | None:
    """Most common non-empty answer. A tie goes to the larger total of ``tiebreak`` (the traces'
    scores, where a scorer ranked them: a 4-4 tie went by order alone, scores unread), then to the
    answer that comes first in ``answers`` (a run's traces in creation order): deterministic."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    tied = [a for a in counts if counts[a] == best]  # Counter keeps first-reached order
    if len(tied) > 1 and tiebreak is not None:
        totals = dict.fromkeys(tied, 0.0)
        for a, w in zip(answers, tiebreak, strict=True):
            if a in totals:
                totals[a] += float(w)
        top = max(totals.values())
        tied = [a for a in tied if totals[a] == top]
    return tied[0]


def weighted_vote(answers: Sequence[str | None], weights: Sequence[float]) -> str | None:
    """Answer with the largest total weight (score-weighted vote); ties to the first reached."""
    totals: dict[str, float] = {}
    for a, w in zip(answers, weights, strict=True):
        if a is not None:
            totals[a] = totals.get(a, 0.0) + float(w)
    if not totals:
        return None
    best = max(totals.values())
    return next(a for a in answers if a is not None and totals[a] == best)


def vote_counts(votes: dict, top: int | None = None, empty: str = "none") -> str:
    """``{"15": 3, "80": 8}`` as ``80 ×8, 15 ×3``: most votes first (ties in the order the answers came),
    the first ``top`` of them; how the live view and the lineage summary show a vote."""
    ranked = sorted(votes.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{a} ×{n}" for a, n in ranked) or empty
