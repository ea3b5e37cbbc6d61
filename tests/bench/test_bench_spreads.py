"""The A/B and repeat figures carry their spread (min-max), ``bench search`` records the flags it was
given, and the benches share one JSON writer and one machine record (no drifted copies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import gambit.bench.profile_step as profile_step
import gambit.bench.search_rounds as search_rounds
from gambit.paths import TARGET


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_profile_ab_reports_the_spread_and_the_pair_ratios(tmp_path, capsys, keep_threads):
    """The layer-loop and stream A/B printed and wrote medians only."""
    out = tmp_path / "profile.json"
    assert profile_step.main(["--model", str(TARGET), "--batch", "1", "--steps", "3", "--threads", "1",
                              "--compare-layers", "--compare-stream", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    for name, sides in (("layer_loop", ("python", "cpp")), ("stream", ("gemm", "gemv"))):
        for side in sides:
            lo, hi = res[f"{name}_spread_ms"][side]
            assert lo <= res[f"{name}_ms"][side] <= hi
        ratio = res[f"{name}_ratio"]
        assert ratio["n"] == 3 and ratio["min"] <= ratio["median"] <= ratio["max"]
    printed = capsys.readouterr().out
    assert "Python layer loop vs the C++ one, median [min-max]: " in printed
    assert "adjacent-step ratios" in printed


def test_profile_without_an_ab_has_empty_figures():
    assert profile_step.ab_summary("stream", {"gemm": [], "gemv": []}) == {"stream_ms": {},
                                                                            "stream_spread_ms": {}}


def fake_repeat(us: float) -> dict:
    cpu = {"finish": 0.001}
    return {"us_per_round": {"round": us, "store": us / 2},
            "us_per_step": {"routing": us / 10, "guidance": us / 20, "kv_evict": 1.0},
            "overhead_cpu_fraction": 0.1, "tree_cpu_fraction": 0.05, "wall_overhead_fraction": 0.2,
            "cpu": cpu, "rounds": 3, "steps": 9, "score_calls": 1}


def test_rounds_table_and_json_show_the_max_of_the_repeats(monkeypatch, tmp_path, capsys, keep_threads):
    """The median line showed medians and minimums but no maximum: a slow repeat was invisible."""
    reps = iter([fake_repeat(300.0), fake_repeat(100.0), fake_repeat(200.0)])
    monkeypatch.setattr(search_rounds, "_one", lambda *a, **k: next(reps))
    out = tmp_path / "rounds.json"
    assert search_rounds.main(["--problems", "1", "--capacity", "4", "--repeat", "3", "--threads", "1",
                               "--json", str(out)]) in (0, None)
    med = json.loads(out.read_text())["median"]
    assert (med["min_us_per_round_round"], med["us_per_round_round"], med["max_us_per_round_round"]) == (
        100.0, 200.0, 300.0)
    assert med["max_us_per_step_routing"] == 30.0
    printed = capsys.readouterr().out
    assert "median of 3 repeats [min-max]: " in printed and "us_per_round_round 200 [100-300]" in printed
    assert "finish_cpu_s 0.0010" in printed


def test_bench_search_records_the_flags_it_was_given(monkeypatch, tmp_path):
    """cli.main(argv) ran ``run_bench`` without them: its JSON recorded this process's sys.argv."""
    import gambit.bench.search as search
    from gambit import cli

    seen = {}
    monkeypatch.setattr(search, "run_bench", lambda cfg, json_path, argv=None: seen.update(argv=argv))
    monkeypatch.setattr("sys.argv", ["pytest", "-q", "tests"])
    out = str(tmp_path / "s.json")
    assert cli.main(["bench", "search", "--quick", "--json", out]) == 0
    assert seen["argv"] == ["--quick", "--json", out]


def test_bench_search_json_command_is_the_argv_passed(monkeypatch, tmp_path):
    from gambit.bench.search import BenchSearchConfig, _report

    monkeypatch.setattr("sys.argv", ["pytest", "-q", "tests"])
    out = {"by_difficulty": {"hard": {"methods": {"sc": {"accuracy": 1.0}}}}}
    path = tmp_path / "s.json"
    _report(out, BenchSearchConfig(quick=True), str(path), lambda o: {}, lambda o: "", lambda o, p: [],
            ["--quick", "--json", str(path)])
    got = json.loads(path.read_text())["provenance"]["command"]
    assert got == f"gambit bench search --quick --json {path}"


def test_one_json_writer_and_one_machine_record(tmp_path):
    """``eval.write_json`` and ``engine.machine_info`` were copies of record.py's, drifting apart (no
    ``default=str``; the machine without its usable cores or vendor)."""
    from gambit.bench import engine, eval, record

    assert eval.write_json is record.write_json
    assert not hasattr(engine, "machine_info")
    eval.write_json({"path": Path("/x")}, tmp_path / "a" / "r.json")  # a Path once raised TypeError
    assert json.loads((tmp_path / "a" / "r.json").read_text()) == {"path": "/x"}
