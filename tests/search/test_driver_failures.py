"""A run whose own part of a step raises (its store write, its vote) ends alone as "failed"; the others
go on, and no result built in a step is lost when the step raises."""

from __future__ import annotations

import pytest
import torch

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.guidance import Guidance
from gambit.search.results import RunResult
from gambit.search.store import MemoryStore, RunUpdate

SC = dict(method="sc", capacity=2, max_tokens=6)  # every trace ends at its cap: both runs in one step


class FlakyStore(MemoryStore):
    """A store that refuses the writes of run ``bad`` chosen by ``when`` (an update -> bool)."""

    def __init__(self, when) -> None:
        super().__init__()
        self.when = when

    def update(self, run_id: str, up: RunUpdate) -> None:
        if run_id == "bad" and self.when(up):
            raise ConnectionError("store refused the write")
        super().update(run_id, up)

    def update_many(self, items) -> None:
        if any(run_id == "bad" and self.when(up) for run_id, up in items):
            raise ConnectionError("store refused the writes")
        super().update_many(items)


def _results(driver: SearchDriver, steps: int = 40) -> dict[str, RunResult]:
    got: dict[str, RunResult] = {}
    for _ in range(steps):
        got.update({ev.run_id: ev for ev in driver.step() if isinstance(ev, RunResult)})
        if not driver.has_work():
            break
    return got


def test_a_run_whose_result_write_fails_ends_failed_and_the_run_ending_beside_it_is_kept(
        make_engine, hard_problems):
    """Before: the write raised out of ``step``, and run a's result, built earlier in that step, was lost."""
    engine = make_engine()
    driver = SearchDriver(engine, store=FlakyStore(lambda up: (up.result or {}).get("reason") == "done"))
    driver.submit(hard_problems[0], SearchConfig(**SC), run_id="a")
    driver.submit(hard_problems[0], SearchConfig(**SC), run_id="bad")
    got = _results(driver)
    assert got["a"].reason == "done" and driver.store.load("a")["result"]["reason"] == "done"
    bad = got["bad"]
    assert bad.reason == "failed" and "ConnectionError: store refused the write" in bad.error
    assert bad.answer == got["a"].answer  # its vote stands: only its write failed
    stored = driver.store.load("bad")["result"]  # the failed result's own write went through
    assert stored["reason"] == "failed" and "store refused" in stored["error"]
    assert not driver.runs and not driver.owner and engine.kv_usage() == 0.0


def test_a_round_write_that_fails_fails_that_run_only(make_engine, scorer, hard_problems):
    """Before: the batched round write raised out of ``step`` and every run's progress was lost."""
    engine = make_engine()
    store = FlakyStore(lambda up: up.result is None and bool(up.rounds))
    driver = SearchDriver(engine, scorer, store=store)
    cfg = dict(capacity=2, swap=1, interval=2, warmup=4, max_tokens=24)
    driver.submit(hard_problems[1], SearchConfig(**cfg), run_id="a")
    driver.submit(hard_problems[1], SearchConfig(**cfg), run_id="bad")
    got = _results(driver, 80)
    assert got["bad"].reason == "failed" and "store refused" in got["bad"].error
    assert got["a"].reason == "done" and got["a"].rounds >= 2
    assert not driver.runs and not driver.owner and engine.kv_usage() == 0.0
    a = store.load("a")
    assert len(a["rounds"]) == got["a"].rounds  # written once each: the failed batch wrote none of them
    # the failed run's unwritten rounds went with its result, and a restart does not take it back
    assert len(store.load("bad")["rounds"]) == got["bad"].rounds
    assert store.unfinished() == [] and SearchDriver(engine, scorer, store=store).recover() == []


def test_a_run_whose_vote_raises_ends_failed_without_one(make_engine, hard_problems, monkeypatch):
    engine = make_engine()
    driver = SearchDriver(engine)
    driver.submit(hard_problems[0], SearchConfig(**SC), run_id="a")
    driver.submit(hard_problems[0], SearchConfig(**SC), run_id="bad")

    def broken(reason):
        raise RuntimeError("vote crashed")

    monkeypatch.setattr(driver.runs["bad"], "finish", broken)
    got = _results(driver)
    assert got["a"].reason == "done"
    assert got["bad"].reason == "failed" and got["bad"].answer is None and "vote crashed" in got["bad"].error
    assert driver.store.load("bad")["result"]["reason"] == "failed"


def test_results_of_a_step_that_raises_after_them_come_with_the_next_step(make_engine, hard_problems):
    """Before: run a had left ``runs`` when the shared part raised: no caller ever saw it end."""
    engine = make_engine()
    driver = SearchDriver(engine)
    driver.submit(hard_problems[0], SearchConfig(**SC), run_id="a")
    driver.submit(hard_problems[0], SearchConfig(method="sc", capacity=2, max_tokens=40), run_id="b")
    evict, raised = driver._kv_evict, []

    def once():
        if "a" not in driver.runs and not raised:
            raised.append(1)
            raise RuntimeError("engine fault")
        evict()

    driver._kv_evict = once
    got: dict[str, RunResult] = {}
    for _ in range(80):
        try:
            got.update({ev.run_id: ev for ev in driver.step() if isinstance(ev, RunResult)})
        except RuntimeError:
            assert "a" not in got
        if not driver.has_work():
            break
    assert raised and got["a"].reason == "done" and got["b"].reason == "done"


class _Run:
    run_id = "r"

    def __init__(self) -> None:
        self.got: list[float] = []

    def on_scores(self, node, scores) -> None:
        self.got.extend(scores)


class _Fut:
    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def test_a_failed_scorer_call_does_not_apply_the_calls_before_it_twice():
    g, run = Guidance(), _Run()
    g.pending = [([(run, None)], _Fut(torch.tensor([0.5]))), ([(run, None)], _Fut(ConnectionError("down"))),
                 ([(run, None)], _Fut(torch.tensor([0.7])))]
    with pytest.raises(ConnectionError):
        g._settle()
    assert run.got == [0.5] and len(g.pending) == 1
    g._settle()
    assert run.got == [0.5, pytest.approx(0.7)] and not g.pending


def test_memory_store_update_many_writes_all_or_none():
    store = MemoryStore()
    with pytest.raises(TypeError):
        store.update_many([("a", RunUpdate(meta={"k": 1}, rounds=[{"round": 1}])),
                           ("b", RunUpdate(meta={"k": object()}))])
    assert store.load("a") is None and store.load("b") is None


def test_the_live_view_names_the_error_of_a_failed_run():
    from gambit.search.live import format_result

    r = RunResult("p1", "sc", None, None, None, "none", {}, {}, [], 12, 0, 0, 0, 0, 0, 0.5, {}, "failed",
                  error="ConnectionError: store refused the write")
    assert format_result(r)[0].startswith("p1 [sc] failed (ConnectionError: store refused the write) after")
