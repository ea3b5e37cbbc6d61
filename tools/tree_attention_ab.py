"""Speculative decoding with multi-token attention rows served by SDPA over gathered blocks beyond 12
tokens a forward (the rule before the multi-row kernel) against the CPU kernel for every speculative
forward (now: ``attention.kernel_serves``), in one process, interleaved (old, new, old, ...): plain
greedy decoding and each (drafter, tree) per batch size, with their outputs checked against plain
decoding. Only where rows go differs (forwards of at most 12 tokens take the kernel under both rules).

Usage: PYTHONPATH=services .venv/bin/python tools/tree_attention_ab.py [BATCH,...] [--trees "T1;T2"]
       [--reps N] [--json FILE]
"""
import argparse
import json
import os
import statistics

import torch

import gambit.engine.attention as attention
from gambit.bench.spec_cells import load_drafters, measure, prompts_for, tree_systems
from gambit.engine import Engine, EngineConfig
from gambit.paths import ASSETS, TARGET


class _Quiet:
    def update(self, n: int) -> None:
        pass


RULES = {"old": lambda items, speculative=False: sum(it.q for it in items) <= 12,  # the rule before
         "new": attention.kernel_serves}
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("batches", nargs="?", default="1,4,16,48", help="batch sizes, comma-separated")
ap.add_argument("--trees", default="defaults;B=48",
                help="tree names (bench.spec_cells.spec_from_name), ';'-separated")
ap.add_argument("--reps", type=int, default=4, help="interleaved repetitions (each: old rule, then new)")
ap.add_argument("--max-tokens", type=int, default=96, help="tokens generated per prompt")
ap.add_argument("--json", default=None, help="write the rows here")
args = ap.parse_args()
torch.set_num_threads(os.cpu_count() or 1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
batches = [int(b) for b in args.batches.split(",")]
pool = prompts_for((2, 8), max(8, max(batches)), 11, eng.tokenizer)
systems = tree_systems(args.trees)
out = []
for b in batches:
    prompts = pool[:max(b, 4)]
    secs = {(r, s): [] for r in RULES for s in ["plain", *systems]}
    taus, lossless, ref = {}, True, {}
    for _ in range(args.reps):
        for rule, fn in RULES.items():
            attention.kernel_serves = fn
            rows = measure(eng, prompts, b, systems, 1, args.max_tokens, ref, _Quiet())
            for s, row in rows.items():
                secs[(rule, s)].append(row["seconds_median"])
                lossless &= row["lossless"]
                if s != "plain":
                    taus[s] = row["tau"]
    attention.kernel_serves = RULES["new"]
    for s in ["plain", *systems]:
        old, new = secs[("old", s)], secs[("new", s)]
        ratio = [o / n for o, n in zip(old, new, strict=True)]
        row = {"batch": b, "system": s, "old_s": statistics.median(old), "new_s": statistics.median(new),
               "new_speedup": statistics.median(ratio), "spread": [min(ratio), max(ratio)],
               "tau": taus.get(s), "over_plain_old": statistics.median(
                   [p / x for p, x in zip(secs[("old", "plain")], old, strict=True)]),
               "over_plain_new": statistics.median(
                   [p / x for p, x in zip(secs[("new", "plain")], new, strict=True)])}
        out.append(row)
        print(f"batch {b:>3} {s:<26} old {row['old_s']:.3f}s new {row['new_s']:.3f}s  "
              f"new/old speed {row['new_speedup']:.2f}x ({min(ratio):.2f}-{max(ratio):.2f})  over plain: "
              f"{row['over_plain_old']:.2f}x -> {row['over_plain_new']:.2f}x", flush=True)
print("lossless:", lossless)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"rows": out, "lossless": lossless, "reps": args.reps}, f, indent=1)
