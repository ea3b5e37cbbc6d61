"""The scorer's ``score`` call, batch-invariant products against the batched network, interleaved: the
shipped process (MLP) and sequence (GRU) scorers at row counts a round scores; medians and spreads in µs.

Usage: PYTHONPATH=services .venv/bin/python tools/scorer_speed.py [--rows 1,8,48,200] [--reps 40]
       [--threads 2] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.scoring.spec import load_scorer_spec

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--rows", default="1,8,48,200", help="rows (boundaries) per score call, comma-separated")
ap.add_argument("--reps", type=int, default=40, help="calls of each side per row count (alternating)")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--json", default="", help="write the table here")
args = ap.parse_args()
torch.set_num_threads(args.threads)

out = []
print(f"{'scorer':9} {'rows':>5} {'invariant µs':>18} {'batched µs':>18} {'ratio':>6}")
for kind in ("process", "sequence"):
    inv, bat = load_scorer_spec(kind, 192), load_scorer_spec(kind, 192, invariant=False)
    assert inv.invariant, inv.invariant_reason
    for n in (int(r) for r in args.rows.split(",")):
        x = torch.randn(n, inv.input_size, generator=torch.Generator().manual_seed(n))
        keys = list(range(n))
        times = {"invariant": [], "batched": []}
        for rep in range(args.reps + 3):
            pair = (("invariant", inv), ("batched", bat))
            for name, s in pair if rep % 2 else pair[::-1]:  # alternate which goes first
                s.reset()  # a sequence scorer's keys start afresh each call
                t = time.perf_counter()
                s.score(keys, x)
                if rep >= 3:  # the first calls pack weights and warm caches
                    times[name].append((time.perf_counter() - t) * 1e6)
        row = {"scorer": kind, "rows": n}
        for name, v in times.items():
            q = statistics.quantiles(v, n=4)
            row[name] = {"median_us": round(statistics.median(v), 1), "q1": round(q[0], 1),
                         "q3": round(q[2], 1)}
        row["ratio"] = round(row["invariant"]["median_us"] / row["batched"]["median_us"], 3)
        out.append(row)
        f = lambda d: f"{d['median_us']:7.0f} [{d['q1']:.0f}, {d['q3']:.0f}]"  # noqa: E731
        print(f"{kind:9} {n:5} {f(row['invariant']):>18} {f(row['batched']):>18} {row['ratio']:6.2f}",
              flush=True)
if args.json:
    with open(args.json, "w") as fh:
        json.dump({"args": vars(args), "rows": out}, fh, indent=1)
