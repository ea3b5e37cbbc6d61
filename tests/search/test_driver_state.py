"""What a long-lived driver keeps per step, and what it keeps per set of runs (stop 68)."""

from __future__ import annotations

from gambit.search import driver as driver_mod
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver


def test_the_kv_trace_keeps_the_latest_steps_only(make_engine, scorer, hard_problems, monkeypatch):
    """A served driver lives as long as its replica: its per-step KV trace grew a tuple every step."""
    monkeypatch.setattr(driver_mod, "KV_TRACE_STEPS", 8)
    drv = SearchDriver(make_engine(num_blocks=400), scorer)
    drv.submit(hard_problems[0], SearchConfig(capacity=4, max_tokens=24), run_id="a")
    drv.run_until_done()
    assert drv.steps > 8
    assert len(drv.kv_trace) == 8
    assert drv.kv_trace[-1][2] == 0  # the latest step kept: no trace left resident


def test_a_deepconf_run_launched_beside_a_plain_one_gets_token_events(make_engine, scorer, hard_problems):
    """The token-event mode is kept per set of runs (``_events_mode``): a run entering the set renews it,
    so a DeepConf run launched beside a run that reads no token events still gets its tokens' confidence."""
    drv = SearchDriver(make_engine(num_blocks=400), scorer)
    drv.submit(hard_problems[0], SearchConfig(method="sc", capacity=2, max_tokens=40), run_id="sc")
    for _ in range(3):
        drv.step()
    assert not drv.runs["sc"].windows  # an SC run reads no token events
    drv.submit(hard_problems[1], SearchConfig(method="deepconf", capacity=4, deepconf_warmup=2,
                                              deepconf_window=4, max_tokens=40), run_id="dc")
    drv.step()
    run = drv.runs["dc"]
    assert any(w.count for w in run.windows.values())  # its windows read this step's tokens
    res = drv.run_until_done()
    assert res["dc"].deepconf_threshold is not None
