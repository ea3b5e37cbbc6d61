"""Δ counts decode steps as plain decoding takes them: tokens a trace emits. A speculative run's step
advances its clock by the mean tokens its emitting traces took, so its rounds fall every ~Δ tokens, as
a plain run's do (counting engine steps, it held about a quarter of the rounds: a different search)."""

from __future__ import annotations

from gambit.engine.config import SpecConfig
from gambit.paths import DRAFTER_PR
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.run_state import SearchRun
from gambit.speculative import load_drafter


def _clock_run(interval: int) -> SearchRun:
    run = SearchRun.__new__(SearchRun)  # the clock alone: no engine, scorer or prompt
    run.cfg = SearchConfig(method="sc", interval=interval)
    run.step, run.clock, run.tick, run.next_round = 0, 0.0, 1.0, interval
    return run


def test_plain_ticks_round_every_interval_steps():
    run = _clock_run(4)
    due = []
    for _ in range(13):
        predicted = run.round_this_step()
        hit = run.count_step()
        assert predicted == hit
        due.append(hit)
    assert [i + 1 for i, d in enumerate(due) if d] == [4, 8, 12]  # step % Δ == 0, as before


def test_speculative_ticks_round_every_interval_tokens():
    run = _clock_run(8)
    hits = []
    for tick in [3.5, 5.0, 1.0, 4.0, 20.0, 1.0]:
        run.tick = tick
        predicted = run.round_this_step()
        hit = run.count_step()
        assert predicted == hit
        hits.append(hit)
    # clock 3.5, 8.5 (round; next 16), 9.5, 13.5, 33.5 (round; past 24 and 32: next 40), 34.5
    assert hits == [False, True, False, False, True, False]
    assert run.clock == 34.5 and run.next_round == 40 and run.step == 6


def test_speculative_run_holds_the_rounds_of_a_plain_one(make_engine, scorer, hard_problems):
    cfg = dict(method="gambit", capacity=8, swap=2, interval=4, warmup=12, seed=3)
    counts = {}
    for decoding in ("plain", "pr"):
        eng = make_engine(spec=SpecConfig(max_batch=0))
        eng.register_drafter("pr", load_drafter(DRAFTER_PR, eng.model))
        driver = SearchDriver(eng, scorer)
        rid = driver.submit(hard_problems[0], SearchConfig(decoding=decoding, **cfg))
        res = driver.run_until_done([rid])[rid]
        data = driver.store.load(rid)
        counts[decoding] = (len(data["rounds"]), driver.steps, res.branched)
        if decoding == "pr":
            assert eng.stats.spec_drafts > 0 and eng.stats.tau > 2
    (plain_rounds, plain_steps, _), (pr_rounds, pr_steps, pr_branched) = counts["plain"], counts["pr"]
    assert pr_steps < 0.6 * plain_steps  # speculation took fewer engine steps...
    assert pr_rounds >= 0.7 * plain_rounds  # ...yet as many rounds, a round every ~Δ tokens
    assert pr_rounds > 1.5 * pr_steps / cfg["interval"] and pr_branched > 0
