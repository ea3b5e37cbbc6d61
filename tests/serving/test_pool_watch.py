"""The engine thread's check for a second OpenMP pool (``pool_watch``), without a real engine: the
end-to-end A/B (``test_openmp_pool``) measures switches, which a loaded machine blurs."""

from __future__ import annotations

import logging
import threading

from gambit.serving import pool_watch
from gambit.serving.pool_watch import SWITCH_CHECK, SWITCH_PERIOD, PoolWatch


def _watch(monkeypatch, per_step: float, threads: int = 2) -> PoolWatch:
    counts = iter([100, 100 + int(per_step * (SWITCH_CHECK[1] - SWITCH_CHECK[0]))] * 4)
    monkeypatch.setattr(pool_watch, "voluntary_switches", lambda tid: next(counts))
    monkeypatch.setattr(pool_watch.torch, "get_num_threads", lambda: threads)
    return PoolWatch(threading.current_thread())


def test_many_switches_per_step_warn_once_in_the_services_log(monkeypatch, caplog):
    watch = _watch(monkeypatch, 30.0)
    with caplog.at_level(logging.WARNING, logger="gambit.serving.target_service"):
        for step in range(1, 2 * SWITCH_PERIOD + SWITCH_CHECK[1] + 1):
            watch.after_step(step)
    said = [r.getMessage() for r in caplog.records if "the engine thread slept" in r.getMessage()]
    assert watch.warned and len(said) == 1 and said[0].startswith("the engine thread slept 30 times")


def test_few_switches_or_one_torch_thread_say_nothing(monkeypatch):
    for per_step, threads in ((1.0, 2), (30.0, 1)):
        watch = _watch(monkeypatch, per_step, threads)
        for step in range(1, SWITCH_CHECK[1] + 1):
            watch.after_step(step)
        assert not watch.warned
