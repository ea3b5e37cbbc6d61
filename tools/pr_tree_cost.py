"""What PR's reconsideration adds to one cycle's draft tree (the paper's tree, B = 48), in isolation.

Captures one cycle's ``cpu_tree.draft`` call for EAGLE-3.1, PR and PR without self-query on a hard
prompt, then replays each many times, interleaved (15 rounds of N calls), and prints the min and
median µs per tree and PR's extra over EAGLE-3.1. The verification forward, which both pay alike,
is left out, so the difference is reconsideration's own cost: the m extra rows through the drafter
and their bookkeeping.

Usage: .venv/bin/python tools/pr_tree_cost.py [N] [THREADS]   (defaults 200, 1)
"""
import statistics
import sys
import time
from dataclasses import replace

import torch

from gambit.bench.spec_cells import BASE, load_drafters, prompts_for
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.paths import ASSETS, TARGET
from gambit.speculative import cpu_tree

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
prompts = prompts_for((6, 8), 1, 100, eng.tokenizer)
systems = {"eagle3.1": ("eagle3.1", BASE), "pr": ("pr", BASE),
           "pr, no self-query": ("pr", replace(BASE, self_query=False))}
draft, calls = cpu_tree.draft, {}


def capture(label):
    def grab(*a, **k):
        calls.setdefault(label, []).append((a, k))
        return draft(*a, **k)
    return grab


for label, (key, spec) in systems.items():
    cpu_tree.draft, eng.config.spec = capture(label), spec
    eng.generate(prompts, SamplingParams(temperature=0, max_tokens=48, decoding=key))
cpu_tree.draft = draft
one = {label: c[3] for label, c in calls.items()}  # the fourth cycle: a context of some length
times = {label: [] for label in one}
for _ in range(15):
    for label, (a, k) in one.items():
        for _ in range(20):
            draft(*a, **k)
        t = time.perf_counter()
        for _ in range(N):
            draft(*a, **k)
        times[label].append((time.perf_counter() - t) / N * 1e6)
base = min(times["eagle3.1"])
print(f"one cycle's draft tree, B = 48, {torch.get_num_threads()} thread(s), 15 x {N} calls")
for label, t in times.items():
    lo, mid = min(t), statistics.median(t)
    print(f"{label:18s} min {lo:7.1f} µs  median {mid:7.1f}  extra (min) {lo - base:+6.1f}")
