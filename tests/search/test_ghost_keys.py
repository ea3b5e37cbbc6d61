"""A finished run leaves nothing in the scorer: its last ghosts' histories are dropped with it."""

from __future__ import annotations

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


def test_a_runs_last_ghosts_are_dropped_from_the_scorer(make_engine, scorer, hard_problems):
    # ~4 of 8 traces fit at full length: ghosts, some still ghosts when the pool runs out
    driver = SearchDriver(make_engine(num_blocks=36), scorer)
    run = driver.submit(hard_problems[1], SearchConfig(method="gambit", capacity=8, swap=2, interval=4,
                                                       warmup=12, seed=3, kv_ratio=0.85))
    res = driver.run_until_done([run])[run]
    assert any(t["end_reason"] == "ghost" for t in res.traces)
    assert not [k for k in scorer.keys if str(k).startswith(f"{run}:")], list(scorer.keys)
