"""``gambit bench rounds``: its counters and its profile of the rounds run on a small search."""

from __future__ import annotations

import json

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
    printed = capsys.readouterr().out
    assert "(do_round)" in printed and "(flush)" in printed  # the profile covers the rounds and writes
