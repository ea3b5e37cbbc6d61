"""Gambit runs on the shipped target: zero-sum pool, ghosts, warmup, children share the parent's KV."""

from __future__ import annotations

from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.results import RunResult

CFG = dict(method="gambit", capacity=8, swap=2, interval=4, warmup=12, seed=3)


def run_to_end(driver, run_id):
    results = driver.run_until_done([run_id])
    return results[run_id], driver.store.load(run_id)


def first_finish_step(data):
    ends = [n["end_step"] for n in data["nodes"].values() if n["state"] == T.FINISHED]
    return min(ends)


def test_zero_sum_pool_stays_at_capacity_every_round(make_engine, scorer, hard_problems):
    driver = SearchDriver(make_engine(), scorer)
    res, data = run_to_end(driver, driver.submit(hard_problems[0], SearchConfig(**CFG)))
    rounds = data["rounds"]
    stop = first_finish_step(data)
    before = [r for r in rounds if r["step"] < stop]
    assert len(before) >= 10 and res.branched > 0 and res.pruned > 0
    assert all(r["active"] == 8 for r in before), [r["active"] for r in before]
    swaps = [r for r in before if r["case"] == 2]
    assert swaps and all(len(r["pruned"]) == len(r["branched"]) <= 2 for r in swaps)
    # the tree adds up: every node is a root or a branch, every branch was recorded once
    assert len(data["nodes"]) == 8 + res.branched
    assert sum(len(r["branched"]) for r in rounds) == res.branched


def test_swap_zero_makes_no_case2_round_and_case1_still_fills(make_engine, scorer, hard_problems):
    """K = 0 (the API takes it; it was served as K = 1): no trace is pruned for another; a finished
    trace's slot is still refilled (Case 1). The same run at K = 2 swaps (above)."""
    driver = SearchDriver(make_engine(), scorer)
    res, data = run_to_end(driver, driver.submit(hard_problems[0], SearchConfig(**{**CFG, "swap": 0})))
    assert res.pruned == 0 and not [r for r in data["rounds"] if r["case"] == 2]
    fills = [r for r in data["rounds"] if r["case"] == 1]
    assert all(r["step"] >= first_finish_step(data) for r in fills)  # only after a trace left the pool
    assert res.branched == sum(len(r["branched"]) for r in fills)


def test_ghosts_keep_the_pool_and_never_trigger_case1(make_engine, scorer, hard_problems):
    # ~4 of 8 traces fit at full length (the prompt's full blocks held once)
    driver = SearchDriver(make_engine(num_blocks=36), scorer)
    res, data = run_to_end(driver, driver.submit(hard_problems[1], SearchConfig(**CFG, kv_ratio=0.85)))
    assert res.evicted > 0
    rounds = data["rounds"]
    stop = first_finish_step(data)
    before = [r for r in rounds if r["step"] < stop]
    assert any(r["ghosts"] > 0 for r in before)
    assert all(r["active"] == 8 and r["case"] != 1 for r in before)
    assert all(r["resident"] + r["ghosts"] == r["active"] for r in rounds)
    # a ghost leaves only by pruning (bottom K) or at the very end, never by finishing
    ghosts = [n for n in data["nodes"].values()
              if n["end_reason"] in ("pruned", "ghost") and n["answer"] is None]
    assert ghosts
    for r in rounds:  # ghosts are never parents
        for p, _ in r["branched"]:
            assert data["nodes"][p]["state"] != T.GHOST or data["nodes"][p]["end_step"] >= r["step"]


def test_warmup_respected(make_engine, scorer, hard_problems):
    driver = SearchDriver(make_engine(), scorer)
    tok = driver.engine.tokenizer
    bid = set(tok.boundary_ids)
    res, data = run_to_end(driver, driver.submit(hard_problems[2], SearchConfig(**{**CFG, "warmup": 30})))
    nodes = data["nodes"]
    assert res.branched > 0
    for n in nodes.values():
        if n["parent"] is None:
            # only boundaries generated at depth >= w were scored
            late = sum(t in bid for t in n["tokens"][29:])
            assert len(n["scores"]) <= late
            if len(n["tokens"]) < 30:
                assert n["scores"] == []
        else:
            parent = nodes[n["parent"]]
            # the parent was >= w tokens past its own birth when the child was made
            assert n["birth_depth"] - parent["birth_depth"] >= 30
            assert n["birth_depth"] >= 30


def test_child_prefix_and_kv_blocks_equal_parent_at_branch(make_engine, scorer, hard_problems):
    engine = make_engine()
    driver = SearchDriver(engine, scorer)
    run_id = driver.submit(hard_problems[3], SearchConfig(**CFG))
    run = driver.runs[run_id]
    checked = 0
    for _ in range(400):
        events = driver.step()
        if any(isinstance(e, RunResult) for e in events):
            break
        if not events:  # a Progress: a round just ran (and was written to the store)
            continue
        rec = driver.store.load(run_id)["rounds"][-1]
        for p, c in rec["branched"]:
            pn, cn = run.nodes[p], run.nodes[c]
            if not pn.resident:
                continue
            assert cn.tokens == pn.tokens and cn.scores == pn.scores and cn.parent == p
            pt, ct = engine.get(pn.engine_id), engine.get(cn.engine_id)
            assert ct.token_ids == pt.token_ids and ct.prompt_len == pt.prompt_len
            full = pt.num_cached // engine.config.block_size
            assert full >= 1
            assert ct.block_table[:full] == pt.block_table[:full]
            assert all(engine.blocks.refcount[b] >= 2 for b in pt.block_table[:full])
            if pt.num_cached % engine.config.block_size:  # the partial block is a copy, not shared
                assert ct.block_table[full] != pt.block_table[full]
            checked += 1
        if checked >= 6:
            break
    assert checked >= 6


def test_cpu_clock_counts_parts_only_when_asked_and_changes_nothing(make_engine, scorer, hard_problems):
    """``cpu_clock`` (``gambit bench rounds``) fills the main-thread CPU parts; off (every other driver)
    they stay 0 and the run is the same, round for round."""
    out = {}
    for clock in (False, True):
        driver = SearchDriver(make_engine(), scorer, cpu_clock=clock)
        res, data = run_to_end(driver, driver.submit(hard_problems[0], SearchConfig(**CFG)))
        out[clock] = (res.answer, res.tokens, res.branched, res.pruned, data["rounds"])
        parts = [driver.cpu[k] for k in ("forward", "routing", "guidance", "round")]
        assert all(p > 0 for p in parts) if clock else all(p == 0 for p in parts), parts
    strip = [{k: v for k, v in r.items() if k != "t"} for r in out[True][4]]
    assert out[False][:4] == out[True][:4]
    assert [{k: v for k, v in r.items() if k != "t"} for r in out[False][4]] == strip


def test_a_runs_timings_cover_the_steps_it_was_in(make_engine, scorer, hard_problems):
    """A run's forward time is every step's forward from its submission to its end, its scheduling the
    steps' routing and KV checks split between the runs of each step."""
    import pytest

    driver = SearchDriver(make_engine(), scorer)
    a = driver.submit(hard_problems[0], SearchConfig(**CFG))
    for _ in range(5):
        driver.step()
    at_b = dict(driver.timings)
    b = driver.submit(hard_problems[1], SearchConfig(**CFG))
    ends = {}
    while len(ends) < 2:
        for ev in driver.step():
            if isinstance(ev, RunResult):
                ends[ev.run_id] = (ev, dict(driver.timings))
    (ra, ta), (rb, tb) = ends[a], ends[b]
    assert ra.timings["forward"] == pytest.approx(ta["forward"], rel=1e-9)
    assert rb.timings["forward"] == pytest.approx(tb["forward"] - at_b["forward"], rel=1e-9)
    both = ra.timings["scheduling"] + rb.timings["scheduling"]  # the shared steps' part, split in two
    assert 0 < ra.timings["scheduling"] and 0 < rb.timings["scheduling"]
    assert both <= max(ta["scheduling"], tb["scheduling"]) * (1 + 1e-9)
    assert ra.timings["guidance"] > 0 and rb.timings["guidance"] > 0
