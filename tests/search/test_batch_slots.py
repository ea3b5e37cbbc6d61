"""Gambit runs whose pools add up past the engine's batch (``max_num_seqs``): a run launches only when its
C fits beside the launched runs' pools (``SearchDriver._fits``), so each searches as it would alone."""

from __future__ import annotations

import dataclasses

import pytest

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.standin import StandInScorer
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEMS = generate("test", 3, 3, TaskConfig(6, 8))


def _cfg(i: int, **kw) -> SearchConfig:
    return SearchConfig(**{"capacity": 4, "swap": 0, "max_tokens": 200, "seed": i, **kw})


def _drive(make_engine, target, runs: list[tuple[int, SearchConfig]], seqs: int = 8):
    drv = SearchDriver(make_engine(max_num_seqs=seqs, num_blocks=2000),
                       StandInScorer(target[0].config.hidden_size, seed=1))
    for i, cfg in runs:
        drv.submit(PROBLEMS[i], cfg, run_id=f"r{i}")
    return drv


def _outcome(res) -> dict:
    return {k: v for k, v in dataclasses.asdict(res).items() if k not in ("wall_s", "timings")}


@pytest.mark.parametrize("swap", [0, 2])
def test_gambit_runs_that_overfill_the_batch_each_search_as_alone(make_engine, target, swap):
    """Three runs of C 4 on 8 slots: the third's traces waited unscored behind the others' and the
    slots its running traces freed went to children (Case 1). At K 0 the second and third branched 3
    and 1 times, alone none; at K 2, 6 and 2 times (alone 2 and 1), in twice the rounds."""
    alone = {}
    for i in range(3):
        drv = _drive(make_engine, target, [(i, _cfg(i, swap=swap))])
        alone[f"r{i}"] = _outcome(drv.run_until_done()[f"r{i}"])
    drv = _drive(make_engine, target, [(i, _cfg(i, swap=swap)) for i in range(3)])
    shared = {k: _outcome(v) for k, v in drv.run_until_done().items()}
    assert {k: v["branched"] for k, v in shared.items()} == {k: v["branched"] for k, v in alone.items()}
    assert shared == alone  # every trace, parent, score, round and answer


def test_a_held_run_launches_when_a_run_ends_its_clock_running_from_its_submit(make_engine, target):
    drv = _drive(make_engine, target, [(i, _cfg(i)) for i in range(3)])
    assert list(drv.held) == ["r2"]  # 4 + 4 of 8 slots taken: it waits, not launched
    assert drv.store.load("r2") is None and not drv.runs["r2"].nodes
    held = drv.runs["r2"]
    t0 = held.t0
    seen = []
    while "r2" in drv.held:
        seen += [e.run_id for e in drv.step()]
    assert "r2" not in seen  # no progress while it waited
    assert {"r0", "r1"} & set(seen)  # it launched at the start of the step after a run ended
    assert held.step == 1 and drv.store.load("r2")["meta"]["step"] == 0 and len(held.traces) == 4
    assert held.t0 == t0  # its clock (max_wall_s, elapsed) counts the wait: it restarted at the launch


def test_a_held_run_whose_deadline_passes_ends_limit_unlaunched(make_engine, target):
    """``max_wall_s`` (the served ``timeout_s``) counts from the submit, as the client's deadline does: its
    clock started at the launch, so a run held 31 s of its 30 then ran up to 30 s more."""
    drv = _drive(make_engine, target, [(0, _cfg(0)), (1, _cfg(1)), (2, _cfg(2, max_wall_s=30))])
    assert list(drv.held) == ["r2"]
    drv.runs["r2"].t0 -= 31  # it has waited 31 s for batch slots
    resident = set(drv.owner)
    (res,) = [e for e in drv.step() if e.run_id == "r2"]
    assert res.reason == "limit" and res.limit == "max_wall_s 30 (timed out queued for batch slots)"
    assert res.traces == [] and res.tokens == 0 and res.rounds == 0 and res.wall_s >= 31
    assert "r2" not in drv.runs and not drv.held and set(drv.owner) <= resident  # took nothing, freed nothing
    assert drv.store.load("r2")["result"]["reason"] == "limit"
    rest = {k: _outcome(v) for k, v in drv.run_until_done().items()}
    without = _drive(make_engine, target, [(0, _cfg(0)), (1, _cfg(1))])
    assert rest == {k: _outcome(v) for k, v in without.run_until_done().items()}


def test_a_run_launched_late_has_only_the_rest_of_its_time(make_engine, target):
    drv = _drive(make_engine, target, [(0, _cfg(0)), (1, _cfg(1)), (2, _cfg(2, max_wall_s=60))])
    run = drv.runs["r2"]
    run.t0 -= 50  # it waited 50 s for batch slots
    while "r2" in drv.held:
        assert not [e for e in drv.step() if e.run_id == "r2"]
    assert 50 <= run.progress(0.0).wall_s < 60 and not run.over_limit()  # elapsed: from its submit
    run.t0 -= 11  # 61 s since its submit: over its limit now, not 60 s after its launch
    (res,) = [e for e in drv.step() if e.run_id == "r2"]
    assert res.reason == "limit" and res.limit == "max_wall_s 60" and res.wall_s >= 61 and res.traces


def test_a_held_run_cancelled_ends_with_no_traces_and_the_others_go_on(make_engine, target):
    drv = _drive(make_engine, target, [(i, _cfg(i)) for i in range(3)])
    drv.step()
    res = drv.cancel("r2")
    assert res.reason == "cancelled" and res.traces == [] and res.tokens == 0
    assert "r2" not in drv.runs and not drv.held
    done = drv.run_until_done()
    assert set(done) == {"r0", "r1"} and all(r.reason == "done" for r in done.values())


def test_sc_runs_launch_past_the_batch_but_not_past_a_held_gambit_run(make_engine, target):
    """SC traces only wait their turn: SC runs still launch past the batch when no Gambit run is in it.
    A Gambit run waits for its C; an SC run behind it waits too (first come, first served)."""
    drv = _drive(make_engine, target, [(i, _cfg(i, method="sc", capacity=6)) for i in range(2)])
    assert not drv.held and len(drv.runs["r1"].traces) == 6  # 12 traces on 8 slots, as before
    drv.submit(PROBLEMS[2], _cfg(2), run_id="g")
    drv.submit(PROBLEMS[2], _cfg(2, method="sc", capacity=1), run_id="s")
    assert list(drv.held) == ["g", "s"]
    while "g" in drv.held:
        drv.step()
    assert set(drv.runs) == {"g", "s"}  # launched together once both SC runs were done (6 + 4 > 8)
    done = drv.run_until_done()
    assert done["g"].reason == "done" and done["s"].reason == "done"


def test_a_gambit_run_that_never_fits_the_batch_is_refused(make_engine, target):
    drv = SearchDriver(make_engine(max_num_seqs=2), StandInScorer(target[0].config.hidden_size, seed=1))
    with pytest.raises(ValueError, match=r"^capacity 4: Gambit keeps .*\(max_num_seqs 2\)"):
        drv.submit(PROBLEMS[0], _cfg(0))
    assert not drv.runs
    drv.submit(PROBLEMS[0], _cfg(0, method="sc"))  # its traces only wait their turn
