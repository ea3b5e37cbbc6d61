"""PR / EAGLE-3.1 per-cycle cost at the paper's tree (B = 48, and B = 24), batch 1, in one process:
plain, EAGLE-3.1 and PR interleaved (``gambit.bench.spec_cells.measure``), REPS repetitions; prints the
ratio's median and spread, each method's cycle time, tau and losslessness. The bench's Table 9 alone,
for A/B runs of two versions (PYTHONPATH=<other checkout>/services).

Usage: .venv/bin/python tools/spec_cycle_ratio.py [REPS]   (default 6)
"""
import os
import sys
from dataclasses import replace

import torch

from gambit.bench.spec_cells import BASE, SPLITS, load_drafters, measure, prompts_for
from gambit.bench.spec_report import _cycle_ratio
from gambit.engine import Engine, EngineConfig
from gambit.paths import ASSETS, TARGET

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)


class _Quiet:
    def update(self, n: int) -> None:
        pass


reps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
torch.set_num_threads(os.cpu_count() or 1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
           for p in prompts_for(ops, 2, 100 + i, eng.tokenizer)]
for budget in (48, 24):
    spec = replace(BASE, budget=budget)
    rows = measure(eng, prompts, 1, {"e": ("eagle3.1", spec), "p": ("pr", spec)}, reps, 96, {}, _Quiet())
    r = _cycle_ratio(rows, "p", "e")
    lo, hi = r["spread"]
    print(f"B={budget}: PR/EAGLE-3.1 cycle cost {r['median']:.3f} ({lo:.3f}-{hi:.3f}); cycle ms PR "
          f"{r['t_cycle_ms'][0]:.2f}, EAGLE-3.1 {r['t_cycle_ms'][1]:.2f}; tau {rows['e']['tau']:.2f} / "
          f"{rows['p']['tau']:.2f}; lossless {rows['p']['lossless'] and rows['e']['lossless']}")
