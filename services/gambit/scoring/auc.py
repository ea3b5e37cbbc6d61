"""Area under the ROC curve as the Mann–Whitney statistic, with tensors (no sklearn)."""

from __future__ import annotations

import torch


def auc(scores, labels) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half.

    Computed from average ranks (ties share their mean rank): ``(R+ - P(P+1)/2) / (P N)``.
    NaN when one class is absent, or when a score is NaN (a diverged net): sorted as the largest, a
    NaN scored as a perfect ranking (1.0 for NaN positives). Labels must be 0/1 or bool: a 0.5 or a NaN
    counted as a positive.
    """
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    y = torch.as_tensor(labels).flatten()
    if s.shape != y.shape:
        raise ValueError(f"scores and labels differ in length: {s.numel()} vs {y.numel()}")
    if y.dtype != torch.bool:
        if not bool(((y == 0) | (y == 1)).all()):
            bad = y[(y != 0) & (y != 1)][0].item()
            raise ValueError(f"labels must be 0/1 or bool, got {bad!r}")
        y = y.bool()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0 or bool(torch.isnan(s).any()):
        return float("nan")
    order = torch.argsort(s, stable=True)
    sorted_s = s[order]
    # average rank (1-based) of each run of equal scores
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks = torch.empty_like(s)
    ranks[order] = mean_rank[inverse]
    r_pos = float(ranks[y].sum())
    return (r_pos - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
