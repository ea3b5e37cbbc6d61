"""Gambit with plain and with PR decoding on one warm engine (the PR drafter loaded first), 6 hard test
problems, C = 16, the search bench's KV sizing, REPS interleaved repetitions: wall per chunk and the
time inside the speculative decoder's store / draft / on_fork (what a capped PR search pays).

Usage: .venv/bin/python tools/search_pr_cost.py [REPS]   (default 3)
"""
import sys
import time
from collections import defaultdict

import torch

from gambit.bench.search import DIFFICULTIES, BenchSearchConfig, chunk_engine
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.scoring.spec import load_scorer_spec
from gambit.search.driver import SearchDriver
from gambit.search.store import MemoryStore
from gambit.speculative import decoder
from gambit.tasks.arithmetic import TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.set_num_threads(2)
model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
scorer = load_scorer_spec("process", model.config.hidden_size)
problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
inside: dict[str, float] = defaultdict(float)


def timed(name):
    f = getattr(decoder.SpecDecoder, name)

    def g(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            inside[name] += time.perf_counter() - t
    setattr(decoder.SpecDecoder, name, g)


for name in ("store", "draft", "on_fork"):
    timed(name)
bcfg = BenchSearchConfig(capacity=16, concurrency=len(problems))
eng, _ = chunk_engine(model, tok, problems, bcfg)
eng.speculator().prepare("pr")
drv = SearchDriver(eng, scorer, MemoryStore())
for rep in range(reps):
    for dec in ("plain", "pr"):
        inside.clear()
        capped = eng.stats.spec_capped_steps
        t0 = time.perf_counter()
        ids = [drv.submit(p, bcfg.search(decoding=dec), run_id=f"{dec}-{rep}-{j}")
               for j, p in enumerate(problems)]
        drv.run_until_done(ids)
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in inside.items()) or "-"
        print(f"rep {rep} {dec:5s} wall {time.perf_counter() - t0:.2f} s; {parts}; capped steps "
              f"{eng.stats.spec_capped_steps - capped}", flush=True)
