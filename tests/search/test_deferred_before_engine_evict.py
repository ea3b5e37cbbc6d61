"""Gambit's deferred boundaries are scored before a step in which the engine may evict by priority."""

from __future__ import annotations

from gambit.search import kv_evict
from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


def test_the_engine_evicts_on_current_scores_at_kv_ratio_one(make_engine, scorer, hard_problems):
    """At r = 1 the driver never evicts: the engine does, when out of blocks, by its traces' priorities
    (their rank scores). Gambit's boundaries waited for the next round's scorer call, so it evicted on
    scores up to Δ steps old. Before every step that may run out of blocks the priorities are now current."""
    engine = make_engine(num_blocks=18)
    driver = SearchDriver(engine, scorer)
    cfg = SearchConfig(capacity=6, swap=1, interval=16, warmup=8, kv_ratio=1.0, max_tokens=120, seed=3)
    run = driver.runs[driver.submit(hard_problems[1], cfg, run_id="r")]
    checked = 0
    while driver.has_work():
        driver.step()
        if run.run_id not in driver.runs or not kv_evict.engine_may_evict(engine):
            continue
        checked += 1
        assert not driver.deferred, len(driver.deferred)
        for n in run.nodes.values():
            if n.state == T.RUNNING and n.engine_id in engine.traces:
                assert engine.traces[n.engine_id].priority == n.rank_score(cfg.rank), n.id
    assert checked and run.evicted  # the pressure is real: the engine evicted
