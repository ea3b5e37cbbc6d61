"""Batch-invariant scoring: a row's score is bit for bit its score alone, in any batch or split."""

from __future__ import annotations

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.scoring.spec import load_scorer_spec

# 192: the shipped target's width; 576: SmolLM2-135M's; 100 rows: vector tails of every length
CASES = [("mlp", 192), ("mlp", 576), ("sequence", 192), ("sequence", 576)]


def _splits(s, keys, x, bounds):
    out = torch.cat([s.score(keys[a:b], x[a:b]) for a, b in bounds])
    s.reset()
    return out


@pytest.mark.parametrize(("kind", "hidden"), CASES)
def test_a_rows_score_is_its_score_alone_in_any_batch(kind, hidden):
    s = random_scorer(kind, hidden, seed=2)
    assert s.invariant, s.invariant_reason
    x = torch.randn(100, s.input_size, generator=torch.Generator().manual_seed(0))
    keys = list(range(100))
    full = _splits(s, keys, x, [(0, 100)])
    assert torch.equal(full, _splits(s, keys, x, [(k, k + 1) for k in range(100)]))
    assert torch.equal(full, _splits(s, keys, x, [(0, 1), (1, 4), (4, 21), (21, 53), (53, 100)]))
    # the batched network's floats to rounding (its own rows move with the batch)
    batched = random_scorer(kind, hidden, seed=2, invariant=False)
    assert not batched.invariant and batched.invariant_reason == "not asked"
    torch.testing.assert_close(full, batched.score(keys, x), atol=1e-6, rtol=0)


def test_sequence_histories_forks_and_repeated_keys_stay_invariant():
    """A GRU key's later boundaries ride on its state: the same floats in a crowd or alone."""
    s = random_scorer("sequence", 64, seed=4)
    x = torch.randn(12, s.input_size, generator=torch.Generator().manual_seed(1))
    crowd = s.score(["a", "b", "a", "c", "a", "b"], x[:6])
    s.fork("a", "a2")
    crowd2 = s.score(["a2", "a", "c"], x[6:9])
    s.reset()
    alone = [s.score(["a"], x[i:i + 1]) for i in (0, 2, 4)]
    s.fork("a", "a2")
    assert torch.equal(torch.cat(alone), crowd[[0, 2, 4]])
    assert torch.equal(s.score(["a2"], x[6:7]), crowd2[:1])
    assert torch.equal(s.score(["a"], x[7:8]), crowd2[1:2])
    # and the history path (training, evaluation) to rounding
    torch.testing.assert_close(crowd[[0, 2, 4]], s.score_history(x[[0, 2, 4]]), atol=1e-5, rtol=0)


def test_the_shipped_process_scorer_scores_invariantly():
    s = load_scorer_spec("process", 192)
    assert s.invariant and s.config.label == "process"
    x = torch.randn(37, s.input_size, generator=torch.Generator().manual_seed(3))
    full = s.score(list(range(37)), x)
    assert torch.equal(full, torch.cat([s.score([i], x[i:i + 1]) for i in range(37)]))


def test_where_it_cannot_hold_the_scorer_says_why():
    attn = random_scorer("sequence", 32, arch="attn")
    assert not attn.invariant and "attn" in attn.invariant_reason
    assert attn.score(["k"], torch.randn(1, 32)).shape == (1,)  # the batched network still scores
    assert not random_scorer("mlp", 32, invariant=False).invariant
