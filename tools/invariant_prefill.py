"""Prefill cost of EngineConfig.batch_invariant: one prompt of N tokens prefilled alone in one step, the
default engine and the batch-invariant one interleaved (default, invariant, invariant, default, ...), median
milliseconds and the ratio per length.

Why: the invariant engine attends every prefill row in the kernels' one-row order (the default engine sends
chunks above 12 tokens to SDPA) and multiplies on its own tiles, so long prompts are where it can cost.

Usage: PYTHONPATH=services .venv/bin/python tools/invariant_prefill.py [--model smollm2]
       [--lengths 64,256,1024] [--reps 3] [--weights bfloat16] [--kv bfloat16] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.bench.engine_backends import make_prompts
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.model.registry import resolve_model

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default="smollm2", help="model folder or registered name")
ap.add_argument("--lengths", default="64,256,1024", help="prompt lengths in tokens, comma-separated")
ap.add_argument("--reps", type=int, default=3, help="interleaved pairs per length")
ap.add_argument("--weights", default="float32", choices=("float32", "bfloat16"),
                help="EngineConfig.cpu_weights of both engines")
ap.add_argument("--kv", default="auto", choices=("auto", "float32", "bfloat16"),
                help="EngineConfig.kv_dtype of both engines")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--json", default="", help="write the rows here")
args = ap.parse_args()
torch.set_num_threads(args.threads)
folder = resolve_model(args.model)
lengths = [int(x) for x in args.lengths.split(",")]
long_ids = make_prompts(folder, 1, max(lengths))[0]
engines = {inv: Engine.from_pretrained(str(folder), EngineConfig(
    model=str(folder), cpu_weights=args.weights, kv_dtype=args.kv, batch_invariant=inv,
    max_num_batched_tokens=max(8192, max(lengths)))) for inv in (False, True)}
sp = SamplingParams(temperature=0, max_tokens=2)  # still running after its prefill step: aborted


def prefill_ms(eng: Engine, ids: list[int]) -> float:
    tid = eng.add(ids, sp)
    t0 = time.perf_counter()
    eng.step()
    dt = time.perf_counter() - t0
    eng.abort(tid)
    return dt * 1e3


rows = []
for n in lengths:
    ids = long_ids[:n]
    for eng in engines.values():
        prefill_ms(eng, ids)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.reps):
        for inv in (False, True) if r % 2 == 0 else (True, False):
            times[inv].append(prefill_ms(engines[inv], ids))
    ratios = [b / a for a, b in zip(times[False], times[True], strict=True)]
    row = {"tokens": n, "default_ms": statistics.median(times[False]),
           "invariant_ms": statistics.median(times[True]), "ratio": statistics.median(ratios),
           "ratio_spread": [min(ratios), max(ratios)], "times": times}
    rows.append(row)
    print(f"{n:5d} tokens: default {row['default_ms']:8.1f} ms, invariant {row['invariant_ms']:8.1f} ms, "
          f"invariant / default {row['ratio']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"model": str(folder), "weights": args.weights, "kv": args.kv, "reps": args.reps,
                   "threads": args.threads, "rows": rows}, f, indent=1)
