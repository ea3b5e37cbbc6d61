"""A search's roots from one shared prefill (``Engine.add_samples``, now) against one prefill per root
(each root ``Engine.add``-ed, before), interleaved: 6 hard test problems searched at once, C = 16,
one KV budget for both (BLOCKS per run; default 96, the search bench's sizing before the prompt was
shared), for SC, STEP and Gambit. Per variant: median wall per chunk and its spread, the first
step (the prefill), peak KV use, evictions, correct answers, and whether the traces are the same.

Usage: .venv/bin/python tools/shared_prompt_ab.py [REPS] [BLOCKS]   (default 4, 96)
"""
import statistics
import sys
import time

import torch

from gambit.bench.search import DIFFICULTIES, BenchSearchConfig
from gambit.engine import Engine, EngineConfig
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.scoring.spec import load_scorer_spec
from gambit.search import tree as T
from gambit.search.driver import SearchDriver
from gambit.search.run_state import SearchRun
from gambit.search.store import MemoryStore
from gambit.tasks.arithmetic import TaskConfig, generate

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 96
torch.set_num_threads(2)
model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
scorer = load_scorer_spec("process", model.config.hidden_size)
problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
shared_roots = SearchRun._launch_roots


def separate_roots(self, n: int) -> None:
    """Before: every root added (and prefilled) by itself."""
    for _ in range(n):
        node = self._new_node(None, self.cfg.temperature)
        self._launch(node)
        assert node.state == T.RUNNING


def chunk(method: str, shared: bool) -> dict:
    SearchRun._launch_roots = shared_roots if shared else separate_roots
    engine = Engine(model, tok, EngineConfig(preemption="evict", num_blocks=blocks * len(problems), seed=0))
    d = SearchDriver(engine, scorer, MemoryStore())
    cfg = BenchSearchConfig(capacity=16, concurrency=len(problems)).search(method=method)
    ids = [d.submit(p, cfg) for p in problems]
    steps, peak, t0, done = [], 0.0, time.perf_counter(), {}
    while d.runs:
        t = time.perf_counter()
        for ev in d.step():
            if getattr(ev, "run_id", None) in ids and hasattr(ev, "correct"):
                done[ev.run_id] = ev
        steps.append(time.perf_counter() - t)
        peak = max(peak, engine.kv_usage())
    res = [done[i] for i in ids]
    return {"wall": time.perf_counter() - t0, "first": steps[0], "peak": peak,
            "evicted": sum(r.evicted for r in res), "correct": sum(bool(r.correct) for r in res),
            "tokens": sum(r.tokens for r in res), "prompt": engine.stats.prompt_tokens,
            "traces": [[tr["tokens"] for tr in r.traces] for r in res]}


chunk("gambit", True)  # warm-up (kernels, first shapes)
rows: dict[tuple[str, bool], list[dict]] = {}
for rep in range(reps):
    for method in ("gambit", "step", "sc"):
        for shared in ((True, False) if rep % 2 else (False, True)):  # ABBA
            rows.setdefault((method, shared), []).append(chunk(method, shared))
    print(f"rep {rep + 1}/{reps} done", flush=True)
print(f"\n6 hard problems at once, C = 16, {blocks} KV blocks per run, 2 threads; "
      f"median (min-max) of {reps}")
print("| method | roots | wall s | first step ms | peak KV | evicted | correct /6 | tokens | "
      "prompt tokens fed |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for (method, shared), rs in rows.items():
    w = [r["wall"] for r in rs]
    print(f"| {method} | {'one shared prefill' if shared else 'one prefill each'} | "
          f"{statistics.median(w):.3f} ({min(w):.3f}-{max(w):.3f}) | "
          f"{1e3 * statistics.median(r['first'] for r in rs):.1f} | {rs[0]['peak']:.2f} | "
          f"{rs[0]['evicted']} | {rs[0]['correct']} | {rs[0]['tokens']} | {rs[0]['prompt']} |")
for method in ("gambit", "step", "sc"):
    a, b = rows[(method, True)], rows[(method, False)]
    ratio = [x["wall"] / y["wall"] for x, y in zip(a, b, strict=True)]
    same = a[0]["traces"] == b[0]["traces"]
    print(f"{method}: shared / separate wall {statistics.median(ratio):.3f} "
          f"({min(ratio):.3f}-{max(ratio):.3f}); same traces: {same}")
