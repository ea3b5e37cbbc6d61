"""Gambit's guidance sync at its rounds: fewer scorer calls, the same search."""

from __future__ import annotations

import pytest

from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


def _go(make_engine, scorer, problems, defer: bool):
    drv = SearchDriver(make_engine(), scorer)
    drv.defers = defer
    cfg = SearchConfig(capacity=6, swap=2, interval=5, warmup=8, max_tokens=70, seed=3)
    ids = [drv.submit(p, cfg, run_id=f"r{i}") for i, p in enumerate(problems[:2])]
    res = drv.run_until_done(ids)
    out = {r: (res[r].answer, res[r].tokens, res[r].branched, res[r].pruned,
               [(t["id"], t["parent"], t["state"], t["score"]) for t in res[r].traces]) for r in ids}
    return out, drv.score_calls, drv.steps


@pytest.mark.parametrize("which", ["stand-in", "shipped process scorer"])
def test_deferred_scoring_is_the_same_search_with_fewer_calls(which, make_engine, scorer, hard_problems):
    """Deferral moves a boundary into another scorer call, beside other rows: the search is unchanged
    to the bit because a row's score does not depend on its batch (``scoring/invariant.py``; before it,
    ties to 1e-8 between mean scores could swap two traces)."""
    if which != "stand-in":
        scorer = load_scorer_spec("process", 192)
        assert scorer.invariant, scorer.invariant_reason
    now, calls_now, steps = _go(make_engine, scorer, hard_problems, defer=False)
    later, calls_later, steps_later = _go(make_engine, scorer, hard_problems, defer=True)
    assert steps_later == steps
    assert later == now  # answers, tokens, branches, prunes, every trace's parent, state and score
    assert any(b for _, _, b, _, _ in now.values())  # the runs did branch (rounds ranked on scores)
    assert calls_later < calls_now, (calls_later, calls_now)


def test_stand_in_scores_do_not_depend_on_the_batch(scorer):
    """What lets deferral keep the search: a state's score is the same alone or in any batch."""
    import torch

    x = torch.randn(37, scorer.hidden_size, generator=torch.Generator().manual_seed(0))
    full = scorer.score(list(range(37)), x)
    parts = torch.cat([scorer.score(list(range(a, b)), x[a:b]) for a, b in ((0, 1), (1, 9), (9, 37))])
    assert torch.equal(full, parts)
