"""The block free list's order, A/B inside one process: a queue (the oldest free block first, the
order before) against the stack the engine uses (the block freed last first), alternated on the same
search chunks (6 hard test problems, C = 16, the search bench's KV sizing, 2 threads, a fresh engine
per chunk as the bench runs). Prints the forward's ms per chunk and the paired ratio stack / queue.

Usage: .venv/bin/python tools/free_list_ab.py [PAIRS]   (default 8)
"""
import statistics
import sys
import time
from collections import deque

import torch

from gambit.bench.search import DIFFICULTIES, BenchSearchConfig, chunk_engine
from gambit.engine import block_manager as BM
from gambit.engine import engine as E
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.scoring.spec import load_scorer_spec
from gambit.search.driver import SearchDriver
from gambit.search.store import MemoryStore
from gambit.tasks.arithmetic import TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

torch.set_num_threads(2)
model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
scorer = load_scorer_spec("process", model.config.hidden_size)
problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
bcfg = BenchSearchConfig(capacity=16, concurrency=len(problems))
acc = {"forward": 0.0}
run_forward = E.ModelRunner.forward


def timed_forward(*a, **k):
    t = time.perf_counter()
    out = run_forward(*a, **k)
    acc["forward"] += time.perf_counter() - t
    return out


def queue_take(self):  # the order before: the oldest free block first
    b = self.free_blocks.popleft()
    self.refcount[b] = 1
    return b


E.ModelRunner.forward = timed_forward
stack_take = BM.BlockManager._take
res = {"queue": [], "stack": []}
for rep in range((int(sys.argv[1]) if len(sys.argv) > 1 else 8) + 1):  # the first is a warm-up
    for mode in (("queue", "stack") if rep % 2 else ("stack", "queue")):
        BM.BlockManager._take = queue_take if mode == "queue" else stack_take
        engine, _ = chunk_engine(model, tok, problems, bcfg)
        if mode == "queue":
            engine.blocks.free_blocks = deque(range(engine.blocks.num_blocks))
        driver = SearchDriver(engine, scorer, MemoryStore())
        acc["forward"] = 0.0
        t0 = time.perf_counter()
        driver.run_until_done([driver.submit(p, bcfg.search()) for p in problems])
        if rep:
            res[mode].append((1e3 * acc["forward"], 1e3 * (time.perf_counter() - t0)))
for mode, v in res.items():
    fwd, chunk = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
    print(f"{mode}: forward ms {[round(x[0]) for x in v]}, median {fwd:.0f}; chunk median {chunk:.0f}")
r = [a[0] / b[0] for a, b in zip(res["stack"], res["queue"], strict=True)]
print(f"stack / queue forward per pair {[round(x, 3) for x in r]}, median {statistics.median(r):.3f}")
