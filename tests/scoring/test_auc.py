"""AUC as Mann–Whitney, against hand-computed cases."""

import math
import random

import pytest
import torch

from gambit.scoring import auc


def test_hand_computed():
    # positives 0.35, 0.8; negatives 0.1, 0.4: pairs (0.35>0.1) (0.35<0.4) (0.8>0.1) (0.8>0.4) → 3/4
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75


def test_ties_count_half():
    # positives 0.5, 0.7; negatives 0.5, 0.2: (0.5=0.5 → ½) (0.5>0.2) (0.7>0.5) (0.7>0.2) → 3.5/4
    assert auc([0.5, 0.7, 0.5, 0.2], [1, 1, 0, 0]) == 0.875
    assert auc([0.3] * 6, [1, 0, 1, 0, 0, 1]) == 0.5


def test_extremes_and_one_class():
    assert auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert auc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0
    assert math.isnan(auc([1, 2], [1, 1]))


def test_matches_pairwise_count():
    rng = random.Random(0)
    s = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(200)]
    y = [rng.random() < 0.4 for _ in range(200)]
    pos = [a for a, b in zip(s, y, strict=True) if b]
    neg = [a for a, b in zip(s, y, strict=True) if not b]
    ref = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert abs(auc(s, y) - ref) < 1e-12


def test_grouped_auc_mean_over_groups_or_weighted_by_pairs():
    """Group 0: one positive below one negative (AUC 0, 1 pair); group 1: two positives above two
    negatives (AUC 1, 4 pairs); group 2 holds one outcome only and is skipped."""
    from gambit.scoring.evaluate import grouped_auc

    s = torch.tensor([0.1, 0.9, 0.8, 0.7, 0.2, 0.3, 0.5, 0.6])
    y = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1]).bool()
    g = torch.tensor([0, 0, 1, 1, 1, 1, 2, 2])
    assert grouped_auc(s, y, g) == (0.5, 2)
    assert grouped_auc(s, y, g, by_pairs=True) == (0.8, 2)


def test_a_nan_score_gives_nan_not_a_perfect_ranking():
    """NaN sorted as the largest score: a diverged net's NaN positives scored AUC 1.0."""
    assert math.isnan(auc([float("nan"), 0.1, 0.2], [1, 0, 1]))
    assert math.isnan(auc(torch.tensor([0.3, float("nan")]), torch.tensor([True, False])))


def test_labels_that_are_not_zero_or_one_are_refused():
    """A 0.5 or a NaN label counted as a positive."""
    for bad in ([0.5, 0], [1, float("nan")], [2, 0]):
        with pytest.raises(ValueError, match="labels must be 0/1 or bool"):
            auc([0.1, 0.2], bad)
    assert auc([0.1, 0.2], [0.0, 1.0]) == auc([0.1, 0.2], torch.tensor([0, 1], dtype=torch.uint8)) == 1.0
