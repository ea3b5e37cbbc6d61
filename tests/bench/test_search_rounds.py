"""``gambit bench rounds``: its counters and its profile of the rounds run on a small search."""

from __future__ import annotations

import json

import pytest
from bench_util import refused_before

from gambit.bench import search_rounds
from gambit.search import run_state


def test_rounds_bench_counts_rounds_and_profiles_them(tmp_path, capsys):
    """One problem at C = 4: the driver's CPU counters are read, ``--ops`` times a round's operations
    (its token read-back rewinds the confidence tracker too) and the cProfile pass runs the real
    rounds (``--profile`` wraps ``SearchRun.flush``, whose signature the driver calls with ``lazy``)."""
    out = tmp_path / "rounds.json"
    flush, do_round = run_state.SearchRun.flush, run_state.SearchRun.do_round
    rc = search_rounds.main(["--problems", "1", "--capacity", "4", "--repeat", "1", "--profile", "40",
                             "--ops", "--ops-steps", "8", "--json", str(out)])
    assert rc in (0, None)
    assert (run_state.SearchRun.flush, run_state.SearchRun.do_round) == (flush, do_round)  # restored
    data = json.loads(out.read_text())
    (rep,) = data["repeats"]
    assert rep["rounds"] > 0 and rep["steps"] > rep["rounds"]
    assert rep["cpu"]["round"] > 0 and rep["cpu"]["forward"] > rep["cpu"]["round"]
    assert 0 < data["median"]["overhead_cpu_fraction"] < 1
    assert data["ops"]["sync_pool_8_tokens"] > 0 and data["ops"]["fork_abort"] > 0  # --ops ran them all
    captured = capsys.readouterr()
    printed = captured.out
    assert "(do_round)" in printed and "(flush)" in printed  # the profile covers the rounds and writes
    # minutes of silence before the first result line: each repeat is said as it starts
    assert "repeat 0: searching 1 problems at C = 4 ..." in captured.err
    finish = data["median"]["finish_cpu_s"]  # "finish_cpu_s 0" for 0.0006 s
    assert f"finish_cpu_s {finish:.4f}" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--problems", "0"], "--problems must be >= 1, got 0"),
    (["--capacity", "3"], "--capacity must be >= 4, got 3"),
    (["--ops-steps", "0"], "--ops-steps must be >= 1, got 0"),
    (["--repeat", "-1"], "--repeat must be >= 0, got -1"),
    (["--profile", "-1"], "--profile must be >= 0, got -1"),
    (["--repeat", "0"], "--repeat 0 measures nothing without --ops or --profile"),
    (["--scorer", "foo"], "--scorer: scorer 'foo': "),
])
def test_bad_flags_are_refused_before_the_model_loads(monkeypatch, args, message):
    """Each bad flag named alone, before ``load_model`` (patched to fail: no load before the check)."""
    import gambit.model.loader

    refused_before(monkeypatch, gambit.model.loader, "load_model", search_rounds.main, args, message)


def test_profile_help_says_its_default(capsys):
    with pytest.raises(SystemExit):
        search_rounds.main(["--help"])
    assert "(default: 0 = no profile)" in " ".join(capsys.readouterr().out.split())
