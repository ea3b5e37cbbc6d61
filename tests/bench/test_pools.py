"""``gambit bench pools``: its flags are checked in the parent, before any child process starts."""

from __future__ import annotations

import pytest
from bench_util import refused_before

import gambit.bench.pools as pools


@pytest.mark.parametrize(("args", "message"), [
    (["--reps", "0"], "--reps must be >= 1, got 0"),
    (["--runs", "0"], "--runs must be >= 1, got 0"),
    (["--capacity", "0"], "--capacity must be >= 1, got 0"),
    (["--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    (["--model", "/nonexistent"], "--model /nonexistent: no model folder there"),
    (["--scorer", "foo"], "--scorer: scorer 'foo': "),
    (["--scorer", "random:gru"], "--scorer: scorer 'random:gru': "),
])
def test_bad_flags_are_refused_before_any_child(monkeypatch, args, message):
    """Each once a traceback from every child process (or a StatisticsError over no runs)."""
    refused_before(monkeypatch, pools, "run_child", pools.main, args, message)


def test_good_flags_pass(monkeypatch):
    """The shipped target and scorer ("" each) and a scorer spec pass the parent's check."""
    seen = []
    monkeypatch.setattr(pools, "run_child", lambda *a: seen.append(a) or {"latency_s": 1.0,
                                                                            "switches_per_step": 0.0})
    assert pools.main(["--reps", "1", "--runs", "1", "--scorer", "confidence"]) == 0
    assert len(seen) == 2
