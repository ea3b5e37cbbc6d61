"""Where an engine step's time goes in a search chunk: the runner's forward, the sampler, the scheduler,
attention metadata and boundary checks, summed over one Gambit chunk (6 hard test problems searched at
once, C = 16, the search bench's KV sizing, 2 threads), REPS times. To compare two versions, run it
from each checkout in turn (``PYTHONPATH=<checkout>/services``), alternating.

Usage: .venv/bin/python tools/engine_step_split.py [REPS]   (default 3)
"""
import sys
import time

import torch

from gambit.bench.search import DIFFICULTIES, BenchSearchConfig, chunk_engine
from gambit.engine import attention as A
from gambit.engine import boundary as B
from gambit.engine import engine as E
from gambit.engine import scheduler as SC
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.scoring.spec import load_scorer_spec
from gambit.search.driver import SearchDriver
from gambit.search.store import MemoryStore
from gambit.tasks.arithmetic import TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
torch.set_num_threads(2)
model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
scorer = load_scorer_spec("process", model.config.hidden_size)
problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
bcfg = BenchSearchConfig(capacity=16, concurrency=len(problems))
acc: dict[str, float] = {}


def timed(owner, name: str, key: str) -> None:
    orig = getattr(owner, name, None)
    if orig is None:  # an older checkout (A/B runs): nothing to time
        return

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = orig(*a, **k)
        acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
        return out

    setattr(owner, name, wrapper)


for owner, name, key in ((E.Engine, "step", "engine step"), (E.ModelRunner, "forward", "forward"),
                         (E.Engine, "_sample", "sampling"), (SC.Scheduler, "schedule", "scheduler"),
                         (A.PagedAttention, "__init__", "attention metadata"),
                         (E.Engine, "_boundaries", "boundary checks"),  # older checkouts
                         (B.BoundaryDetector, "events", "boundary checks")):
    timed(owner, name, key)
for rep in range(reps + 1):  # the first is a warm-up
    acc.clear()
    engine, _ = chunk_engine(model, tok, problems, bcfg)
    driver = SearchDriver(engine, scorer, MemoryStore())
    t0 = time.perf_counter()
    driver.run_until_done([driver.submit(p, bcfg.search()) for p in problems])
    wall = time.perf_counter() - t0
    if rep:
        outside = acc["engine step"] - acc["forward"]
        parts = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in acc.items())
        print(f"rep {rep}: chunk {1e3 * wall:.0f} ms; {parts} ms; engine step outside the forward "
              f"{1e3 * outside:.1f} ms ({100 * outside / wall:.1f}%)")
