"""Speculative decoding against plain greedy decoding by batch size, uncapped: where a tree per trace
stops paying on this machine (what ``SpecConfig.max_batch`` should be), and whether a smaller tree
pays at the batch sizes a search runs. Plain and every (drafter, tree) interleaved
(``gambit.bench.spec_cells.measure``), ``--reps`` repetitions per batch; after them, one more pass of each
system splits its time into drafting and the rest (verification forwards, sampling, bookkeeping).

Usage: .venv/bin/python tools/spec_batch_speed.py [BATCH,...] [--trees "T1;T2"] [--reps N]
  BATCH,...  batch sizes (default 1,2,3,4,6)
  --trees    tree names for ``bench.spec_cells.spec_from_name``, ";"-separated: "defaults" (the engine's
             tree) or the paper's tree with changes, e.g. "g=3 B=3 Bw=1 k=1 m=0" (a 3-token chain)
             (default "defaults")
  --reps     interleaved repetitions per batch (default 4)
"""
import argparse
import os

import torch

from gambit.bench.spec_cells import load_drafters, measure, prompts_for, run_once, tree_systems
from gambit.engine import Engine, EngineConfig
from gambit.paths import ASSETS, TARGET


class _Quiet:
    def update(self, n: int) -> None:
        pass


ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("batches", nargs="?", default="1,2,3,4,6", help="batch sizes, comma-separated")
ap.add_argument("--trees", default="defaults",
                help="tree names (bench.spec_cells.spec_from_name), ';'-separated")
ap.add_argument("--reps", type=int, default=4, help="interleaved repetitions per batch")
args = ap.parse_args()
batches = [int(b) for b in args.batches.split(",")]
torch.set_num_threads(os.cpu_count() or 1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS, keys=("eagle3.1", "pr"))  # what tree_systems uses (2 reserved caches)
pool = prompts_for((2, 8), max(8, max(batches)), 11, eng.tokenizer)
systems = tree_systems(args.trees)
for b in batches:
    prompts = pool[:max(b, 4)]
    rows = measure(eng, prompts, b, systems, args.reps, 96, {}, _Quiet())
    for label, (key, spec) in systems.items():
        eng.config.spec = spec
        d0 = eng.stats.draft_seconds
        dt, *_ = run_once(eng, prompts, b, key, 96)
        r = rows[label]
        lo, hi = r["speedup_spread"]
        print(f"batch {b:>3} {label:<34} tau {r['tau']:.2f}  {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f})  "
              f"drafting {(eng.stats.draft_seconds - d0) / dt:.0%} of its time  lossless {r['lossless']}",
              flush=True)
