"""``gambit bench search``'s figures and merged report: a figure is drawn only from the runs it plots,
and a part's notes reach the merged report."""

from __future__ import annotations

import json
from pathlib import Path

from gambit.bench.search import BenchSearchConfig, run_bench
from gambit.bench.search_report import plot_all

SPLIT = {k: 0.2 for k in ("forward", "guidance", "tree", "scheduling", "other")}
ROW = {"accuracy": 0.6, "majority_accuracy": 0.55, "weighted_accuracy": 0.6, "tokens": 1200.0, "wall_s": 2.0,
       "trace_throughput": 8.0, "finished_traces": 12.0, "evicted": 0.0, "overhead_fraction": 0.03,
       "problems": 4, "time_split": SPLIT, "series": [[0.0, 4, 4, 0.5], [1.0, 3, 3, 0.6]]}


def _out(*extra: str) -> dict:
    methods = {"gambit": ROW, "sc": dict(ROW, accuracy=0.5), **{k: dict(ROW, accuracy=0.55) for k in extra}}
    config = {"capacity": 16, "swap": 4, "interval": 8, "warmup": 24, "kv_ratio": 0.9}
    return {"config": config, "targets": [],
            "by_difficulty": {"hard": {"ops": [6, 8], "kv_blocks_per_run": 8, "methods": methods}}}


def test_no_sweep_and_no_frontier_draw_neither_figure(tmp_path: Path):
    """`--no-sensitivity --no-frontier` wrote a Figure 10 of one dot per panel and a Figure 5 over the
    real ones (README's `--plots docs/figures`)."""
    files = plot_all(_out(), str(tmp_path))
    assert [Path(f).name for f in files] == ["fig3_6_utilisation.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig3_6_utilisation.png"]


def test_each_figure_is_drawn_from_its_own_runs(tmp_path: Path):
    assert [Path(f).name for f in plot_all(_out("gambit[swap=1]"), str(tmp_path / "a"))] == [
        "fig3_6_utilisation.png", "fig10_sensitivity.png"]
    assert [Path(f).name for f in plot_all(_out("sc@4", "gambit@4"), str(tmp_path / "b"))] == [
        "fig5_frontier.png", "fig3_6_utilisation.png"]


def test_a_merged_report_keeps_each_parts_notes(tmp_path: Path, capsys):
    """A part that timed the PyTorch path (its C++ kernels did not load) says so in the merged report."""
    part = _out()
    part["notes"] = ["the C++ CPU kernels did not load (x): these figures are the slower PyTorch path's"]
    f = tmp_path / "part.json"
    f.write_text(json.dumps(part))
    cfg = BenchSearchConfig(merge=str(f), plots=str(tmp_path / "plots"))
    out = run_bench(cfg, str(tmp_path / "merged.json"))
    assert out["notes"] == [f"{f}: {part['notes'][0]}"]
    assert f"note: {f}: the C++ CPU kernels did not load" in capsys.readouterr().out
    assert json.loads((tmp_path / "merged.json").read_text())["notes"] == out["notes"]
