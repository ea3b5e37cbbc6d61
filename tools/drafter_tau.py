"""Greedy τ of the shipped EAGLE-3.1 and PR drafters, and of any drafter folders given, on the spec
bench's prompts (PER test problems per difficulty split, 96 tokens, batch 1), at the paper's tree
(B = 48, γ = 8, Bw = 6, k = 6, m = 3), with k = 4, at B = 24 and at the engine's defaults. Greedy
τ is deterministic: one pass, no repetitions; it prints τ and the ratio to EAGLE-3.1's.

Usage: .venv/bin/python tools/drafter_tau.py [PER] [DRAFTER_FOLDER ...]   (PER default 4)
"""
import sys
from dataclasses import replace

import torch

from gambit.bench.spec import ASSETS, BASE, DEFAULTS, SPLITS, load_drafters, prompts_for, run_once
from gambit.engine import Engine, EngineConfig
from gambit.paths import TARGET
from gambit.speculative import load_drafter

per = int(sys.argv[1]) if len(sys.argv) > 1 else 4
extra = sys.argv[2:]
torch.set_num_threads(1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
keys = ["eagle3.1", "pr"]
for path in extra:
    eng.register_drafter(path, load_drafter(path, eng.model))
    keys.append(path)
prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
           for p in prompts_for(ops, per, 100 + i, eng.tokenizer)]
trees = {"B=48": BASE, "B=48, k=4": replace(BASE, offer_width=4), "B=24": replace(BASE, budget=24),
         "defaults": DEFAULTS}
print(f"greedy tau, {len(prompts)} prompts, batch 1 | " + " | ".join(keys))
for name, spec in trees.items():
    eng.config.spec = spec
    taus = []
    for key in keys:
        _, _, cycles, accepted = run_once(eng, prompts, 1, key, 96)
        taus.append((accepted + cycles) / cycles)
    print(f"{name:10s} " + "  ".join(f"{t:.3f}" for t in taus) +
          "   / EAGLE-3.1: " + " ".join(f"{t / taus[0]:.3f}" for t in taus[1:]))
