"""The driver's admission (``search.admission``): a run taken over whose C can never fit this engine's
batch is refused as ``submit`` refuses it, not held and then launched to branch on (stop 68)."""

from __future__ import annotations

import copy

import pytest

from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.store import MemoryStore, RunUpdate

CFG = SearchConfig(capacity=4, swap=0, max_tokens=40, seed=3)


def _stored(make_engine, scorer, problem, run_id: str = "big") -> dict:
    """A Gambit run of C 4 written mid-run by a coordinator (on an engine of 256 slots) that then died."""
    store = MemoryStore()
    a = SearchDriver(make_engine(), scorer, store)
    a.submit(problem, CFG, run_id=run_id)
    for _ in range(3):
        a.step()
    return copy.deepcopy(store.load(run_id))


def _store_of(data: dict, run_id: str = "big") -> MemoryStore:
    s = MemoryStore()
    s.update(run_id, RunUpdate(meta=data["meta"], nodes=list(data["nodes"].values())))
    return s


def test_adopt_refuses_a_gambit_run_above_the_batch_as_submit_does(make_engine, scorer, hard_problems):
    data = _stored(make_engine, scorer, hard_problems[0])
    small = SearchDriver(make_engine(max_num_seqs=2), scorer, MemoryStore())
    with pytest.raises(ValueError) as submitted:
        small.submit(hard_problems[0], CFG)
    with pytest.raises(ValueError) as adopted:  # it was held, then launched alone on 2 slots
        small.adopt("big", copy.deepcopy(data))
    assert str(adopted.value) == str(submitted.value) and "max_num_seqs 2" in str(adopted.value)
    assert not small.runs and not small.held and not small.engine.has_unfinished()
    assert small.store.load("big") is None  # nothing written for a refused takeover
    # SC runs only wait their turn: taken over as before
    sc = SearchDriver(make_engine(max_num_seqs=2), None, MemoryStore())
    sc_data = copy.deepcopy(data)
    sc_data["meta"]["config"]["method"] = "sc"
    assert sc.adopt("big", sc_data).cfg.method == "sc" and "big" in sc.runs


def test_recover_ends_a_run_the_batch_can_never_hold_and_takes_back_the_rest(make_engine, scorer,
                                                                             hard_problems):
    data = _stored(make_engine, scorer, hard_problems[0])
    other = _stored(make_engine, scorer, hard_problems[1], "ok")
    other["meta"]["config"]["capacity"] = 2
    store = _store_of(data)
    store.update("ok", RunUpdate(meta=other["meta"], nodes=list(other["nodes"].values())))
    b = SearchDriver(make_engine(max_num_seqs=2), scorer, store)
    assert b.recover() == ["ok"]  # the refusal does not stop the others' recovery
    assert set(b.runs) == {"ok"} and store.unfinished() == ["ok"]
    ended = store.load("big")
    res = ended["result"]
    assert res["reason"] == "limit" and "max_num_seqs 2" in res["limit"] and "not taken over" in res["limit"]
    assert all(n["state"] != T.RUNNING for n in ended["nodes"].values())
    assert b.recover() == []  # ended: not refused again at the next restart
