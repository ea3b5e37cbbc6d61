"""The driver's KV-ratio eviction with a remote (async) scorer ranks on the same scores as in-process."""

import pytest
from test_async_settle import AsyncStandIn

from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.standin import StandInScorer


def _evictions(driver: SearchDriver, rid: str) -> tuple[list[tuple[int, int, float]], object]:
    """(step, node, its rank score) of each trace the run lost, in order, and the run's result."""
    run, seen, out = driver.runs[rid], set(), []
    result = None
    while driver.has_work():
        for ev in driver.step():
            if getattr(ev, "run_id", None) == rid and hasattr(ev, "answer"):
                result = ev
        for n in run.nodes.values():
            if n.state == T.EVICTED and n.id not in seen:
                seen.add(n.id)
                out.append((n.evicted_step, n.id, round(n.rank_score(run.cfg.rank), 6)))
    return out, result


@pytest.mark.parametrize("blocks, ratio, interval", [(40, 0.8, 64), (30, 0.9, 5)],
                         ids=["driver-evicts", "engine-evicts"])
def test_a_remote_scorer_evicts_the_same_traces_as_an_in_process_one(make_engine, target, hard_problems,
                                                                    blocks, ratio, interval):
    """STEP's boundaries go to a remote scorer every step, but their scores were applied at its rounds only:
    the KV-ratio check (``_kv_evict``) ranked its traces on scores a few boundaries old, and so did the
    engine's own eviction when out of blocks (its priority is the score). On the same seeds the traces lost
    (and the scores they were lost on) differed from an in-process scorer's."""
    h = target[0].config.hidden_size
    cfg = SearchConfig(method="step", capacity=6, kv_ratio=ratio, interval=interval, seed=3)

    def go(scorer):
        driver = SearchDriver(make_engine(num_blocks=blocks), scorer)
        rid = driver.submit(hard_problems[2], cfg, run_id="r")
        ev, res = _evictions(driver, rid)
        assert not driver.pending
        return ev, res.answer, [t.get("score") for t in res.traces]

    sync = go(StandInScorer(h, seed=1))
    assert len(sync[0]) == 2, sync[0]  # the pressure is real
    assert go(AsyncStandIn(StandInScorer(h, seed=1))) == sync
