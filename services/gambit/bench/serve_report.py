"""What ``gambit bench serve`` reports: the table it prints, and what a stopped run measured (Ctrl-C:
``<json>.partial``)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import TYPE_CHECKING

from gambit.bench import record, serve_store

if TYPE_CHECKING:
    from gambit.bench.serve import BenchServeConfig


def finished(cfg: BenchServeConfig, got: dict) -> dict | None:
    """What a stopped run measured (Ctrl-C: ``<json>.partial``): per wiring and level the walls done, and
    the one-run pairs' ratios with their spread; None before the first measured run."""
    rows, ratios = got.get("rows", {}), got.get("ratios", [])
    if not rows:
        return None
    systems: dict = {}
    for (name, n), reps in sorted(rows.items()):
        walls = [r["wall"] for r in reps]
        systems.setdefault(name, []).append({"runs": n, "reps_done": len(walls), "wall_s": walls,
                                             "runs_per_s": n * cfg.waves / statistics.median(walls),
                                             "wall_spread_s": [min(walls), max(walls)]})
    pairs = record.spread(ratios) if ratios else None
    return {"config": {**asdict(cfg), "store": serve_store.shown(cfg.store), "prefix": got.get("prefix")},
            "systems": systems, "wall_ratio_values": ratios, "wall_ratio_pairs": len(ratios),
            "wall_ratio": pairs and pairs["median"],
            "wall_ratio_spread": pairs and [pairs["min"], pairs["max"]]}


def table(res: dict) -> str:
    lines = ["| runs | embedded runs/s | distributed runs/s | embedded p50 / p95 s "
             "| distributed p50 / p95 s |",
             "|---:|---:|---:|---|---|"]
    for e, d in zip(res["systems"]["embedded"]["concurrency"], res["concurrency"], strict=True):
        lines.append(f"| {e['runs']} | {e['runs_per_s']:.2f} | {d['runs_per_s']:.2f} | "
                     f"{e['p50_s']:.2f} / {e['p95_s']:.2f} | {d['p50_s']:.2f} / {d['p95_s']:.2f} |")
    lines.append("")
    lo, hi = res["wall_ratio_spread"]
    lines.append(f"wall ratio (distributed / embedded, 1 run): {res['wall_ratio']:.3f}, the median of "
                 f"{res['wall_ratio_pairs']} adjacent pairs [{lo:.3f}, {hi:.3f}]; ratio of the medians "
                 f"{res['wall_ratio_of_medians']:.3f}")
    e1, d1 = res["systems"]["embedded"]["concurrency"][0], res["concurrency"][0]
    lines.append(f"1 run, p50 s: latency embedded {e1['p50_s']:.3f} / distributed {d1['p50_s']:.3f}; "
                 f"the run as its driver timed it {e1['run_p50_s']:.3f} / {d1['run_p50_s']:.3f}")
    lines.append(f"guidance-sync share: distributed {res['sync_share']:.3f}, embedded "
                 f"{res['systems']['embedded']['sync_share']:.3f}")
    top = res["concurrency"][-1]["runs"]
    lines.append(f"scaling efficiency at {top} runs: {res['scaling_efficiency']:.3f} (service speed-up "
                 f"{res['service_speedup']:.2f} / engine speed-up {res['engine_speedup'][str(top)]:.2f}); "
                 f"embedded {res['embedded_scaling_efficiency']:.3f}")
    lines.append(f"same tokens in both systems: {res['same_tokens']}")
    return "\n".join(lines)
