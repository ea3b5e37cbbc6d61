"""One run at a time, as a backend's single request: the default engine against ``batch_invariant``
(the serving surfaces' default where it holds, stop 54), alternating on the same problems and seeds in
one process; per-run wall medians [quartiles] and the median of the per-problem ratios.

Usage: PYTHONPATH=services .venv/bin/python tools/invariant_solve_ab.py [--model smollm2 --cpu-weights
       bfloat16 --kv-dtype bfloat16] [--problems 12] [--capacity 8] [--max-tokens 400] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.engine import Engine, EngineConfig
from gambit.model.registry import resolve_model
from gambit.paths import TARGET
from gambit.scoring import random_scorer
from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.tasks.arithmetic import TaskConfig, generate

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default="", help="target model folder or registered name ('': the shipped target)")
ap.add_argument("--cpu-weights", default="float32", help="the engine's linear weights: float32 | bfloat16")
ap.add_argument("--kv-dtype", default="auto", help="KV cache elements: auto | float32 | bfloat16")
ap.add_argument("--problems", type=int, default=12, help="hard test-split problems (6-8 operations)")
ap.add_argument("--capacity", type=int, default=8, help="C of each run")
ap.add_argument("--max-tokens", type=int, default=400, help="tokens per trace at most")
ap.add_argument("--method", default="gambit", help="gambit | sc | step | deepconf")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--json", default="", help="write the runs and the summary here")
args = ap.parse_args()
torch.set_num_threads(args.threads)

model = str(resolve_model(args.model) if args.model else TARGET)
drivers = {}
for name, inv in (("default", False), ("invariant", True)):
    cfg = EngineConfig(model=model, preemption="evict", cpu_weights=args.cpu_weights,
                       kv_dtype=args.kv_dtype, batch_invariant=inv)
    eng = Engine.from_pretrained(model, cfg)
    hidden = eng.model.config.hidden_size
    scorer = load_scorer_spec("process", hidden, note=None)
    if scorer.hidden_size != hidden:  # a real checkpoint: a scorer of its width (no signal)
        scorer = random_scorer("mlp", hidden)
    drivers[name] = SearchDriver(eng, scorer)
problems = generate("test", args.problems, 0, TaskConfig(6, 8))
scfg = SearchConfig(method=args.method, capacity=args.capacity, swap=2, seed=0, max_tokens=args.max_tokens)
runs = {name: [] for name in drivers}
for i, p in enumerate(problems):
    order = list(drivers) if i % 2 else list(drivers)[::-1]  # alternate which goes first
    for name in order:
        drv = drivers[name]
        t = time.perf_counter()
        rid = drv.submit(p, scfg, run_id=f"{name}{i}")
        res = drv.run_until_done([rid])[rid]
        runs[name].append({"wall_s": time.perf_counter() - t, "tokens": res.tokens, "correct": res.correct})
    print(f"problem {i}: " + "  ".join(f"{n} {runs[n][-1]['wall_s']:.3f} s ({runs[n][-1]['tokens']} tok)"
                                       for n in drivers), flush=True)
ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(runs["default"], runs["invariant"], strict=True)]
summary = {}
for name, rs in runs.items():
    w = [r["wall_s"] for r in rs]
    q = statistics.quantiles(w, n=4)
    summary[name] = {"median_s": statistics.median(w), "q1": q[0], "q3": q[2],
                     "tokens_per_s": sum(r["tokens"] for r in rs) / sum(w),
                     "accuracy": sum(bool(r["correct"]) for r in rs) / len(rs)}
    print(f"{name:9}: median {summary[name]['median_s']:.3f} s [{q[0]:.3f}, {q[2]:.3f}], "
          f"{summary[name]['tokens_per_s']:.0f} tokens/s, accuracy {summary[name]['accuracy']:.3f}")
q = statistics.quantiles(ratios, n=4)
print(f"invariant / default wall: median of per-problem ratios {statistics.median(ratios):.3f} "
      f"[{q[0]:.3f}, {q[2]:.3f}]")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "runs": runs, "summary": summary,
                   "ratio_median": statistics.median(ratios), "ratio_q1": q[0], "ratio_q3": q[2]},
                  f, indent=1)
