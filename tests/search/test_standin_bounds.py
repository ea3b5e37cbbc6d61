"""The stand-in scorer remembers keys like the real ones: at most ``max_keys``, least recently used
forgotten (a set of every key ever scored grew for a server's life)."""

from __future__ import annotations

import pytest
import torch

from gambit.search.standin import StandInScorer


def test_the_stand_in_keeps_at_most_max_keys_least_recently_used_first():
    s = StandInScorer(8, seed=1, max_keys=2)
    s.score(["a", "b"], torch.randn(2, 8))
    s.score(["a"], torch.randn(1, 8))  # "a" used last: "b" goes first
    s.fork("a", "c")
    assert list(s.keys) == ["a", "c"] and s.evicted == 1
    s.drop("a")
    assert list(s.keys) == ["c"]
    for i in range(100):
        s.score([f"k{i}"], torch.randn(1, 8))
    assert len(s.keys) == 2 and s.evicted == 100


def test_the_stand_in_scores_the_same_whatever_it_remembers():
    x = torch.randn(3, 8)
    assert torch.equal(StandInScorer(8, max_keys=1).score(["a", "b", "c"], x),
                       StandInScorer(8).score(["a", "b", "c"], x))


@pytest.mark.parametrize("bad", [0, 1.5, True])
def test_a_bad_max_keys_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="max_keys must be an int >= 1"):
        StandInScorer(8, max_keys=bad)
