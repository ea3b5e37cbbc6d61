"""The load test's end-to-end latency per method: one row over the whole mix hid which method was slow
or failing (a gambit run and an sc run cost differently by design)."""

from __future__ import annotations

import subprocess

from test_loadtest_run import _fake_server  # tests/ops is on sys.path (as for ops_util)

from gambit.ops import loadtest
from gambit.ops.loadtest import COLUMNS, method_rows, read_summary, summary_lines, write_summary


def test_one_row_per_method_with_its_own_percentiles_and_failures(tmp_path):
    rows = method_rows({"sc": ([100.0, 300.0, 200.0, 400.0], 1), "gambit": ([900.0] * 19 + [5000.0], 0),
                        "step": ([], 2), "deepconf": ([], 0)}, elapsed_s=10.0)
    by = {r["entry"]: r for r in rows}
    assert list(by) == ["end to end gambit", "end to end sc", "end to end step"]  # none: no row
    assert by["end to end sc"] == {"entry": "end to end sc", "requests": 5, "failures": 1, "p50_ms": 200,
                                   "p95_ms": 400, "p99_ms": 400, "mean_ms": 250.0, "per_s": 0.4}
    assert (by["end to end gambit"]["p50_ms"], by["end to end gambit"]["p95_ms"],
            by["end to end gambit"]["p99_ms"]) == (900, 900, 5000)
    assert by["end to end step"]["p50_ms"] == "" and by["end to end step"]["failures"] == 2
    assert all(set(r) == set(COLUMNS) for r in rows)
    totals = loadtest.run_totals(10.0, 8, 80, 3, 0, {})
    assert any(ln.startswith("end to end sc ") for ln in summary_lines(rows, totals, {}))
    got, _ = read_summary(write_summary(tmp_path / "s.csv", rows, totals))
    assert [r["entry"] for r in got] == list(by)


def test_locust_against_a_fake_service_reports_each_method(tmp_path):
    """Run as `gambit loadtest --address` runs it: the summary table and CSV carry a row per method."""
    server, address = _fake_server()
    try:
        cfg = loadtest.LoadTestConfig(address=address, users=3, spawn_rate=3, run_time_s=3, stop_timeout_s=5,
                                      cancel_fraction=0.0, csv_prefix=str(tmp_path / "lt"),
                                      summary_csv=str(tmp_path / "s.csv"))
        r = loadtest.run_locust(cfg, address)
    finally:
        server.stop(0)
    assert isinstance(r, subprocess.CompletedProcess) and "Gambit load test:" in r.stdout, r.stderr[-3000:]
    rows, _ = read_summary(cfg.summary_csv)
    methods = {row["entry"]: row for row in rows if row["entry"].startswith("end to end ")}
    assert "end to end gambit" in methods, r.stdout[-3000:]
    assert set(methods) <= {f"end to end {m}" for m in ("gambit", "sc", "step", "deepconf")}
    # the fake refuses a third of the seeds: failures land on the methods, and the rows add up
    assert sum(int(m["failures"]) for m in methods.values()) > 0
    e2e = next(row for row in rows if row["entry"] == "Solve end to end")
    ok = sum(int(m["requests"]) - int(m["failures"]) for m in methods.values())
    assert ok == int(e2e["requests"]) - int(e2e["failures"])
    assert any(ln.startswith("end to end gambit") for ln in r.stdout.splitlines())
