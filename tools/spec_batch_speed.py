"""Speculative decoding against plain greedy decoding by batch size, uncapped, at the engine's tree:
where a tree per trace stops paying on this machine (what ``SpecConfig.max_batch`` should be).
Plain, PR and EAGLE-3.1 interleaved (``gambit.bench.spec.measure``), 4 repetitions per batch.

Usage: .venv/bin/python tools/spec_batch_speed.py [BATCH,...]   (default 1,2,3,4,6)
"""
import os
import sys

import torch

from gambit.bench.spec import ASSETS, DEFAULTS, load_drafters, measure, prompts_for
from gambit.engine import Engine, EngineConfig
from gambit.paths import TARGET


class _Quiet:
    def update(self, n: int) -> None:
        pass


batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1,2,3,4,6").split(",")]
torch.set_num_threads(os.cpu_count() or 1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
pool = prompts_for((2, 8), max(8, max(batches)), 11, eng.tokenizer)
systems = {"pr": ("pr", DEFAULTS), "eagle3.1": ("eagle3.1", DEFAULTS)}
for b in batches:
    rows = measure(eng, pool[:max(b, 4)], b, systems, 4, 96, {}, _Quiet())
    cells = []
    for k in systems:
        lo, hi = rows[k]["speedup_spread"]
        cells.append(f"{k} {rows[k]['speedup']:.2f}x ({lo:.2f}-{hi:.2f})")
    print(f"batch {b}: " + "  ".join(cells), flush=True)
