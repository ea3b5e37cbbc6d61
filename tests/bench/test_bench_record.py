"""The bench commands' own standard: JSON records the command line, machine, versions and seeds; a
ratio is the median of per-repetition ratios with its spread; Ctrl-C writes what finished or says it
wrote nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gambit.bench.pools as pools

TARGET = str(Path(pools.__file__).parents[1] / "assets" / "target")


def fake_children(monkeypatch, latencies: dict[str, list[float]], stop_at: int | None = None) -> list[str]:
    """``run_child`` replaced: each mode's latencies in turn; Ctrl-C at call ``stop_at``."""
    order: list[str] = []

    def run_child(mode, *a):
        if stop_at is not None and len(order) == stop_at:
            raise KeyboardInterrupt
        order.append(mode)
        return {"latency_s": latencies[mode][order.count(mode) - 1], "switches_per_step": 1.0}

    monkeypatch.setattr(pools, "run_child", run_child)
    return order


def test_pools_ratio_is_the_median_of_per_rep_ratios_and_json_says_how_to_rerun(monkeypatch, tmp_path):
    """The ratio of the medians was 1.2 here, while each repetition's own pair said 2, 1, 3."""
    order = fake_children(monkeypatch, {"two pools": [0.100, 0.060, 0.030],
                                        "one pool": [0.050, 0.060, 0.010]})
    out = tmp_path / "pools.json"
    assert pools.main(["--reps", "3", "--runs", "1", "--json", str(out)]) == 0
    assert order == ["one pool", "two pools", "two pools", "one pool", "one pool", "two pools"]  # alternating
    res = json.loads(out.read_text())
    assert res["two_over_one"] == pytest.approx(2.0)
    assert res["two_over_one_pairs"]["min"] == pytest.approx(1.0)
    assert res["two_over_one_pairs"]["max"] == pytest.approx(3.0)
    prov = res["provenance"]
    assert prov["command"] == f"gambit bench pools --reps 3 --runs 1 --json {out}"
    assert {"cpu", "torch_threads", "torch", "python", "cores"} <= set(prov["machine"])
    assert "seeds" in prov


def test_pools_ctrl_c_writes_the_finished_reps(monkeypatch, tmp_path, capsys):
    fake_children(monkeypatch, {"two pools": [0.1] * 3, "one pool": [0.05] * 3}, stop_at=3)
    out = tmp_path / "pools.json"
    with pytest.raises(KeyboardInterrupt):
        pools.main(["--reps", "3", "--runs", "1", "--json", str(out)])
    part = json.loads(Path(str(out) + ".partial").read_text())
    assert part["interrupted"] and part["reps_done"] == 1 and part["two_over_one"] == pytest.approx(2.0)
    assert not out.exists()
    assert "interrupted; wrote what it finished to" in capsys.readouterr().err


def test_pools_ctrl_c_before_a_pair_says_nothing_was_written(monkeypatch, tmp_path, capsys):
    fake_children(monkeypatch, {"two pools": [0.1], "one pool": [0.05]}, stop_at=1)
    out = tmp_path / "pools.json"
    with pytest.raises(KeyboardInterrupt):
        pools.main(["--reps", "2", "--runs", "1", "--json", str(out)])
    assert not list(tmp_path.iterdir())
    assert "interrupted; nothing written (nothing finished yet)" in capsys.readouterr().err


def test_engine_ratios_are_per_round_then_the_median():
    from gambit.bench.engine_report import _median_rows, _rows

    rounds = {"native": [[{"batch": 1, "tok_s": t}] for t in (100, 60, 30)],
              "hf": [[{"batch": 1, "tok_s": t}] for t in (50, 60, 10)]}
    medians = {k: _median_rows(v) for k, v in rounds.items()}
    (row,) = _rows([1], medians, rounds)
    assert row["native_vs_hf"] == pytest.approx(2.0)  # not 60 / 50
    assert row["native_vs_hf_spread"] == pytest.approx([1.0, 3.0])
    assert row["native_tok_s_min"] == 30 and row["native_tok_s_max"] == 100


def test_engine_table_shows_the_spread_of_rounds():
    from gambit.bench.engine_report import _median_rows, _rows, format_table

    rounds = {"native": [[{"batch": 1, "tok_s": t}] for t in (100, 60, 30)],
              "hf": [[{"batch": 1, "tok_s": t}] for t in (50, 60, 10)]}
    rows = _rows([1], {k: _median_rows(v) for k, v in rounds.items()}, rounds)
    table = format_table({"rows": rows, "model": "m", "new_tokens": 4, "temperature": 0.8, "repeats": 3,
                          "weight_bytes": 1, "bandwidth_gbs": 1.0})
    assert "native fp32 30-100 tok/s" in table and "nat/HF 1.00-3.00" in table


def test_linears_json_has_spread_and_provenance(tmp_path, capsys):
    import torch

    from gambit.bench import linears

    threads = torch.get_num_threads()
    out = tmp_path / "lin.json"
    try:
        assert linears.main(["--model", TARGET, "--rows", "1", "--repeats", "2", "--threads", "1",
                             "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = json.loads(out.read_text())
    key = next(iter(res["us"]))
    for name, (lo, hi) in res["us_spread"][key].items():
        assert lo <= res["us"][key][name] <= hi
    assert res["provenance"]["command"].startswith("gambit bench linears --model ")
    assert res["provenance"]["seeds"] == {"torch": 0}
    assert "median [min-max] of 2 interleaved rounds" in capsys.readouterr().out


def test_command_line_of_this_process(monkeypatch):
    from gambit.bench import record

    monkeypatch.setattr("sys.argv", ["/x/bin/gambit", "bench", "search", "--quick", "--json", "a b.json"])
    assert record.command_line("search") == "gambit bench search --quick --json 'a b.json'"
    assert record.command_line("pools", ["--reps", "2"]) == "gambit bench pools --reps 2"


def test_spread_of_one_value():
    from gambit.bench import record

    assert record.spread([2.0]) == {"median": 2.0, "min": 2.0, "max": 2.0, "iqr": [2.0, 2.0], "n": 1}
    assert record.pair_ratios([None, 4.0], [1.0, 2.0])["median"] == 2.0
    assert record.pair_ratios([None], [1.0]) is None


def test_ctrl_c_whose_partial_results_fail_says_why_not_that_nothing_finished(tmp_path, capsys):
    """A ``partial()`` that raised was reported as "nothing finished yet (the partial results failed...)":
    the first half contradicted the second (the run may have finished a lot)."""
    from gambit.bench.record import on_interrupt

    def broken() -> dict:
        raise KeyError("rows")

    with pytest.raises(KeyboardInterrupt), on_interrupt("x", tmp_path / "x.json", broken):
        raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert ("gambit bench x: interrupted; nothing written (its partial results failed: KeyError: 'rows')"
            in err)
    assert "nothing finished yet" not in err and not list(tmp_path.iterdir())
