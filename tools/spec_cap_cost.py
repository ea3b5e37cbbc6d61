"""What a batch-capped speculative trace costs over a plain one (``SpecConfig.max_batch``).

Decodes the same prompts at batch N (default 96, the search bench's 6 runs x 16 traces) plainly and
as ``pr`` with the cap below N, so every step is a plain one and the difference is the drafter
bookkeeping (``SpecDecoder.store``: the taps each capped trace keeps for when it drafts again),
interleaved, 6 repetitions; prints the medians, the time inside ``store`` per run and per step (a step
here: every trace of the batch), and the capped steps of one run.

Usage: .venv/bin/python tools/spec_cap_cost.py [N]
"""
import statistics
import sys
import time

import torch

from gambit.bench.spec_cells import load_drafters, prompts_for
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.paths import ASSETS, TARGET
from gambit.speculative.decoder import SpecDecoder

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 96
torch.set_num_threads(2)
eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET), spec=SpecConfig(max_batch=N - 1)))
load_drafters(eng, ASSETS)
prompts = prompts_for((6, 8), N, 7, eng.tokenizer)
inside = {"store": 0.0}
store = SpecDecoder.store


def timed_store(*a, **k):
    t = time.perf_counter()
    try:
        return store(*a, **k)
    finally:
        inside["store"] += time.perf_counter() - t


SpecDecoder.store = timed_store


def run(decoding: str) -> float:
    sp = [SamplingParams(temperature=0.8, max_tokens=96, decoding=decoding, seed=i, ignore_eos=True)
          for i in range(N)]
    t = time.perf_counter()
    eng.generate(prompts, sp)
    return time.perf_counter() - t


run("plain")
run("pr")
plain, capped, stores, per_step = [], [], [], []
for _ in range(6):
    plain.append(run("plain"))
    inside["store"] = 0.0
    s0 = eng.stats.spec_capped_steps
    capped.append(run("pr"))
    stores.append(inside["store"])
    per_step.append(inside["store"] / max(1, eng.stats.spec_capped_steps - s0))
p, c = statistics.median(plain), statistics.median(capped)
print(f"batch {N}: plain {p:.3f} s, capped pr {c:.3f} s ({c / p:.3f}x); inside store "
      f"{statistics.median(stores):.3f} s a run, {statistics.median(per_step) * 1e6:.1f} us a step; drafts "
      f"{eng.stats.spec_drafts}, capped steps {eng.stats.spec_capped_steps - s0} a run")
