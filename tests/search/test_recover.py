"""A coordinator crash: a new driver reloads the unfinished run from Redis and finishes it."""

from __future__ import annotations

import copy
import time

import pytest

from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.redis_store import RedisStore
from gambit.search.results import RunResult
from gambit.search.store import MemoryStore, RunUpdate

CFG = SearchConfig(capacity=6, swap=2, interval=4, warmup=12, seed=5)


def crash_after_rounds(driver, run_id, rounds):
    seen = 0
    while seen < rounds:
        seen += len(driver.step())
    return {i: n.state for i, n in driver.runs[run_id].nodes.items()}


def test_reloaded_run_finishes_with_the_pool_it_had(make_engine, scorer, hard_problems, redis_store):
    engine = make_engine()
    a = SearchDriver(engine, scorer, redis_store)
    rid = a.submit(hard_problems[5], CFG, run_id="crash1")
    other = a.submit(hard_problems[0], CFG, run_id="crash2")
    crash_after_rounds(a, rid, 24)  # 12 rounds each: the first swap that gains is in round 11
    saved = redis_store.load(rid)
    pool = {i for i, n in saved["nodes"].items() if n["state"] in (T.RUNNING, T.GHOST)}
    assert len(pool) == 6 and saved["meta"]["branched"] > 0
    del a  # the coordinator dies; the engine (the Target deployment) and Redis live on

    b = SearchDriver(engine, scorer, RedisStore(prefix=redis_store.prefix))
    assert sorted(b.recover()) == ["crash1", "crash2"]
    run = b.runs[rid]
    assert {i for i, n in run.nodes.items() if n.active} == pool
    # Δ's clock goes on where it was (a plain run's is its step count): rounds keep their phase
    assert run.clock == saved["meta"]["clock"] == saved["meta"]["step"] == run.step
    assert run.next_round == saved["meta"]["next_round"] and run.next_round % CFG.interval == 0
    assert all(run.owner[n.engine_id][1] == n.id for n in run.nodes.values() if n.resident)
    rounds = []
    results = b.run_until_done(on_event=lambda e: rounds.append(e) if getattr(e, "run_id", "") == rid else 0)
    assert set(results) == {rid, other}
    res = results[rid]
    assert res.reason == "done" and res.finished_traces >= 6 and res.answer is not None
    final = redis_store.load(rid)
    assert final["result"]["run_id"] == rid and redis_store.unfinished() == []
    # every trace of the pool it had is still there, and lived on after the restart
    for i in pool:
        assert final["nodes"][i]["end_step"] is None or final["nodes"][i]["end_step"] >= saved["meta"]["step"]
    # the first rounds after the restart keep the zero-sum pool
    first = [p for p in rounds if hasattr(p, "active")][:3]
    assert first and all(p.active == 6 for p in first)
    assert engine.kv_usage() == 0.0 or not engine.has_unfinished()


def test_reload_onto_a_fresh_engine_recomputes(make_engine, scorer, hard_problems, redis_store):
    a = SearchDriver(make_engine(), scorer, redis_store)
    rid = a.submit(hard_problems[1], CFG, run_id="crash3")
    crash_after_rounds(a, rid, 3)
    saved = redis_store.load(rid)
    del a
    engine = make_engine()  # the Target restarted too: no trace survives
    b = SearchDriver(engine, scorer, RedisStore(prefix=redis_store.prefix))
    assert b.recover() == [rid]
    run = b.runs[rid]
    for i, n in run.nodes.items():
        if n.resident:
            t = engine.get(n.engine_id)
            assert t.token_ids == run.prompt_ids + saved["nodes"][i]["tokens"]
    res = b.run_until_done()[rid]
    assert res.reason == "done" and res.finished_traces > 0
    # the stored tree says it was taken over, and where: its traces' tokens trail the step clock from there
    final = redis_store.load(rid)
    assert final["meta"]["resumed_at"] == [saved["meta"]["step"]]
    from gambit.search.lineage import lineage_text

    assert f"resumed at step {saved['meta']['step']}" in lineage_text(rid, final).splitlines()[3]


def test_a_taken_over_run_keeps_its_wall_clock(make_engine, hard_problems):
    """``max_wall_s`` (the served ``timeout_s``) and the elapsed time count from the run's first
    admission: a takeover restarted them, so a run of 60 s taken over at 50 s ran ~110 s."""
    store = MemoryStore()
    a = SearchDriver(make_engine(), None, store)
    rid = a.submit(hard_problems[0], SearchConfig(method="sc", capacity=2, max_wall_s=60, seed=5))
    a.step()
    data = store.load(rid)
    assert 0 <= time.time() - data["meta"]["started_at"] < 30
    data["meta"]["started_at"] -= 50  # it had run 50 s when its replica was lost
    run = SearchDriver(make_engine(), None, MemoryStore()).adopt(rid, copy.deepcopy(data))
    assert 50 <= run.progress(0.0).wall_s < 60 and not run.over_limit()
    data["meta"]["started_at"] -= 11  # 61 s: over its limit at once, not 60 s after the takeover
    b = SearchDriver(make_engine(), None, MemoryStore())
    b.adopt(rid, data)
    (res,) = [e for e in b.step() if isinstance(e, RunResult)]
    assert res.reason == "limit" and res.limit == "max_wall_s 60" and res.wall_s >= 61


def test_a_deepconf_run_taken_over_in_its_warm_up_keeps_its_threshold(make_engine, hard_problems):
    """The warm-up threshold is a percentile of each warm-up trace's lowest window confidence: it was read
    from the windows, which a takeover rebuilds empty, so a warm-up trace that had ended before the
    takeover dropped out of the percentile (11.20 against the whole run's 11.11). It reads the stored
    ``conf_min`` now."""
    cfg = SearchConfig(method="deepconf", capacity=8, deepconf_warmup=4, deepconf_window=8, temperature=1.5,
                       seed=3)
    full = SearchDriver(make_engine())
    rid = full.submit(hard_problems[3], cfg)
    want = full.run_until_done()[rid].deepconf_threshold
    store = MemoryStore()
    a = SearchDriver(make_engine(), None, store)
    rid = a.submit(hard_problems[3], cfg)
    run = a.runs[rid]
    while not any(n.state == T.FINISHED for n in run.nodes.values()):
        a.step()
    for _ in range(8):  # until a round has written the ended trace
        a.step()
    assert run.phase == 1
    data = copy.deepcopy(store.load(rid))
    assert any(d["state"] == T.FINISHED for d in data["nodes"].values())
    b = SearchDriver(make_engine(), None, MemoryStore())
    b.adopt(rid, data)
    assert b.run_until_done()[rid].deepconf_threshold == pytest.approx(want, rel=1e-6)  # stored in float32


def test_runs_taken_over_wait_for_batch_slots_in_the_order_adopted(make_engine, target):
    """Restored runs skipped the batch-slot hold (``SearchDriver._fits``): three Gambit runs of C 4 taken
    over onto an engine of 8 slots all launched, and the third's traces waited unscored behind the others'
    while their freed slots went to children. Each is held now until it fits, and searches as alone."""
    import dataclasses

    from gambit.search.standin import StandInScorer
    from gambit.tasks.arithmetic import TaskConfig, generate

    problems = generate("test", 3, 3, TaskConfig(6, 8))
    cfgs = [SearchConfig(capacity=4, swap=0, max_tokens=200, seed=i) for i in range(3)]
    store = MemoryStore()
    for i, cfg in enumerate(cfgs):  # each written mid-run by a coordinator that then died
        a = SearchDriver(make_engine(), StandInScorer(target[0].config.hidden_size, seed=1), store)
        a.submit(problems[i], cfg, run_id=f"t{i}")
        while store.load(f"t{i}")["meta"]["round"] < 2:
            a.step()
    saved = {r: copy.deepcopy(store.load(r)) for r in store.unfinished()}

    def driver(data: dict) -> SearchDriver:
        s = MemoryStore()
        for run_id, d in data.items():
            s.update(run_id, RunUpdate(meta=d["meta"], nodes=list(d["nodes"].values())))
        return SearchDriver(make_engine(max_num_seqs=8, num_blocks=2000),
                            StandInScorer(target[0].config.hidden_size, seed=1), s)

    def outcome(res) -> dict:
        return {k: v for k, v in dataclasses.asdict(res).items() if k not in ("wall_s", "timings")}

    alone = {}
    for r in saved:
        b = driver({r: saved[r]})
        assert b.recover() == [r] and not b.held
        alone[r] = outcome(b.run_until_done()[r])
    b = driver(saved)
    assert b.recover() == ["t0", "t1", "t2"]
    assert list(b.held) == ["t2"] and not b.runs["t2"].traces  # 4 + 4 of 8 slots taken
    assert all(n.engine_id is None for n in b.runs["t2"].nodes.values())
    assert {k: outcome(v) for k, v in b.run_until_done().items()} == alone
