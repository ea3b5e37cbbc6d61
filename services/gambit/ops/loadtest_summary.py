"""The load test's summary: table rows (Locust's entries and one per method), the headline totals,
failures grouped by kind, and the summary CSV with its totals JSON. Pure: reads Locust's stats objects,
needs neither Locust nor Ray to test."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

ENTRIES = ("Solve first event", "Solve end to end", "Solve cancelled", "CancelRun")
# a failed call is fired as "<entry> (failed)": Locust times every request it is told of, so a refusal's
# 1 ms under "Solve first event" made the TTFT percentiles look fast exactly when the service failed
FAILED = " (failed)"
FAILURE_LINES = 20  # failure kinds printed after the table (all of them are in Locust's failures CSV)


def failure_kind(text: str) -> str:
    """The group a failure is counted in: Locust groups by the exact message, and the server's details
    (free KV blocks, a run id) split one overload into dozens of "x1" lines that pushed the table out."""
    return re.sub(r"\d+", "N", text)


def summary_rows(stats, elapsed_s: float) -> list[dict]:
    """One row per entry: every call (requests) and the failed ones; p50/p95/p99/mean (ms) and per s
    of the calls that succeeded only (failures are their own "<entry> (failed)" Locust entries)."""
    rows = []
    for name in ENTRIES:
        ok, bad = (stats.entries.get((n, "grpc")) for n in (name, name + FAILED))
        n_ok = ok.num_requests - ok.num_failures if ok is not None else 0
        n_bad = (ok.num_failures if ok is not None else 0) + (bad.num_failures if bad is not None else 0)
        if n_ok + n_bad == 0:
            continue
        row = {"entry": name, "requests": n_ok + n_bad, "failures": n_bad}
        for q in (50, 95, 99):
            row[f"p{q}_ms"] = ok.get_response_time_percentile(q / 100) if n_ok else ""
        row["mean_ms"] = round(ok.avg_response_time, 1) if n_ok else ""
        row["per_s"] = round(n_ok / max(elapsed_s, 1e-9), 3)
        rows.append(row)
    return rows


COLUMNS = ("entry", "requests", "failures", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "per_s")
METHOD_ENTRY = "end to end "  # + method: the per-method rows after Locust's entries


def method_rows(by_method: dict[str, tuple[list[float], int]], elapsed_s: float) -> list[dict]:
    """"Solve end to end" split by method: (end-to-end ms of its runs with a result, failed Solve calls)
    per method. Methods differ in cost by design (a gambit run is not an sc run), so one row over the
    mix hid which method was slow or failing; cancelled runs are in neither (their end is the cancel)."""
    rows = []
    for method in sorted(by_method):
        times, n_bad = by_method[method]
        ms = sorted(times)
        row = {"entry": METHOD_ENTRY + method, "requests": len(ms) + n_bad, "failures": n_bad}
        for q in (50, 95, 99):  # nearest rank, as exact as the sample allows
            row[f"p{q}_ms"] = round(ms[max(0, -(-q * len(ms) // 100) - 1)]) if ms else ""
        row["mean_ms"] = round(sum(ms) / len(ms), 1) if ms else ""
        row["per_s"] = round(len(ms) / max(elapsed_s, 1e-9), 3)
        if row["requests"]:
            rows.append(row)
    return rows


def run_totals(elapsed_s: float, runs: int, generated: int, request_failures: int, task_errors: int,
               by_mix: dict[str, list[int]]) -> dict:
    """The headline's numbers; ``failures`` counts a task's exception too (a crashing task said 0)."""
    finished, correct = (sum(c[i] for c in by_mix.values()) for i in (0, 1))
    return {"elapsed_s": round(elapsed_s, 1), "runs": runs, "generated_tokens": generated,
            "tokens_per_s": round(generated / max(elapsed_s, 1e-9), 1),
            "failures": request_failures + task_errors, "task_errors": task_errors,
            "finished": finished, "correct": correct}


def summary_lines(rows: list[dict], totals: dict, by_mix: dict[str, list[int]]) -> list[str]:
    t = totals
    lines = [f"Gambit load test: {t['elapsed_s']:.1f} s, {t['runs']} runs with a result, "
             f"{t['tokens_per_s']:.1f} generated tokens/s, {t['failures']} failures"
             + (f" ({t['task_errors']} task errors)" if t["task_errors"] else "")
             + f"; answers right {t['correct']} of {t['finished']} finished runs "
             f"({100 * t['correct'] / max(t['finished'], 1):.1f}%)",
             "percentiles, mean and per s: the calls that succeeded",
             f"{'entry':<20} {'requests':>8} {'failures':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
             f"{'mean ms':>8} {'per s':>7}"]
    for r in rows:
        lines.append(f"{r['entry']:<20} {r['requests']:>8} {r['failures']:>8} {r['p50_ms']:>8} "
                     f"{r['p95_ms']:>8} {r['p99_ms']:>8} {r['mean_ms']:>8} {r['per_s']:>7}")
    if by_mix:
        lines.append("right answers by mix entry: " + ", ".join(
            f"{k} {r}/{n}" for k, (n, r) in sorted(by_mix.items())))
    return lines


def failure_lines(failures: list[tuple[str, str, int]], samples: dict[tuple[str, str], str],
                  limit: int = FAILURE_LINES) -> list[str]:
    """(entry, kind, count) most frequent first, each with one sample of the server's details."""
    ranked = sorted(failures, key=lambda f: (-f[2], f[0], f[1]))
    lines = [f"failure: {entry}: {kind} x{n}" + (f" (e.g. {samples[entry, kind]})"
                                                   if samples.get((entry, kind)) else "")
             for entry, kind, n in ranked[:limit]]
    if len(ranked) > limit:
        lines.append(f"... and {len(ranked) - limit} more failure kinds (Locust's <csv-prefix>_failures.csv)")
    return lines


def totals_path(summary_csv) -> Path:
    """The totals beside the summary CSV, which stays plain CSV (its "# …" line read as a data row)."""
    return Path(summary_csv).with_suffix(".totals.json")


def write_summary(path, rows: list[dict], totals: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    totals_path(path).write_text(json.dumps(totals, indent=1) + "\n")
    return path


def read_summary(path) -> tuple[list[dict], str]:
    """The rows, and the totals as one "key=value ..." line."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(ln for ln in f if not ln.startswith("#")))
    tp = totals_path(path)
    totals = json.loads(tp.read_text()) if tp.exists() else {}
    return rows, " ".join(f"{k}={v}" for k, v in totals.items())
