"""Greedy τ of drafters at the paper's tree (B = 48, γ = 8, Bw = 6, k = 6, m = 3), with k = 4, at
B = 24 and at the engine's defaults, batch 1. Greedy τ is deterministic: one pass, no repetitions;
it prints τ and the ratio to the first drafter's, and with --json writes them.

Shipped target (default): the shipped EAGLE-3.1 and PR drafters plus any folders given, on the spec
bench's prompts (PER test problems per difficulty split, 96 tokens; --split dev: dev problems instead).
Another target of this task (--model FOLDER without --prompts, e.g. a re-ship candidate): the drafter
folders given, on the same prompts.
A real checkpoint (--model --prompts): the drafter folders given (EAGLE-3.1's first), on the last PER
questions of a GSM8K-layout file through the model's chat template (the held-out end `gambit train
drafter --prompts` never trains on).

--speed N adds wall time: plain and each drafter interleaved N times per tree, speedup = plain seconds /
drafter seconds within a repetition (median and min-max), after a warm-up of each, and whether every
drafter's greedy output equals plain decoding's. --cpu-weights / --kv-dtype: the engine's precision;
--batch-invariant: EngineConfig.batch_invariant (one order of arithmetic per row).

Usage: .venv/bin/python tools/drafter_tau.py [--per N] [--model M --prompts FILE] [--speed N]
       [--cpu-weights bfloat16] [--kv-dtype bfloat16] [--batch-invariant] [FOLDER ...]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.bench.spec_cells import (
    BASE,
    SPLITS,
    _pool_analysis,
    load_drafters,
    prompts_for,
    run_once,
    spec_from_name,
)
from gambit.cpu_info import CPU_WEIGHTS, KV_DTYPES
from gambit.engine import Engine, EngineConfig
from gambit.model.registry import resolve_model
from gambit.paths import ASSETS, TARGET
from gambit.speculative import load_drafter

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("folders", nargs="*", help="drafter folders (with --model: EAGLE-3.1's first)")
ap.add_argument("--per", type=int, default=4, help="prompts per split (shipped) or in all (--model)")
ap.add_argument("--model", default="", help="target model folder or name ('' = the shipped target)")
ap.add_argument("--prompts", default="", help="with --model: GSM8K-layout JSONL; its last --per questions "
                "('' = the spec bench's task prompts, for a target trained on this project's task)")
ap.add_argument("--split", default="test", choices=["test", "dev"], help="this task's problems: test (the "
                "bench's) or dev (to choose a setting without reading the test)")
ap.add_argument("--max-tokens", type=int, default=96, help="tokens generated per prompt")
ap.add_argument("--trees", default="B=48,B=48 k=4,B=24,defaults",
                help="comma-separated trees: \"defaults\" or space-separated KNOB=N changes to the paper's "
                "tree (B budget, g gamma, Bw grow width, k offer width, m reconsidered rows) and \"merge\", "
                "e.g. \"B=48 g=12,B=48 k=4\"")
ap.add_argument("--threads", type=int, default=1, help="torch threads")
ap.add_argument("--pool", action="store_true",
                help="also the reject pool and why cycles end at B = 48 (one more pass each)")
ap.add_argument("--speed", type=int, default=0,
                help="also wall time: N interleaved repetitions (plain, each drafter, ...) per tree; "
                     "speedup = plain seconds / drafter seconds per repetition, median and spread")
ap.add_argument("--cpu-weights", default="float32", choices=CPU_WEIGHTS,
                help="the engine's CPU linear weights (EngineConfig.cpu_weights)")
ap.add_argument("--kv-dtype", default="auto", choices=KV_DTYPES,
                help="the engine's KV cache elements (EngineConfig.kv_dtype)")
ap.add_argument("--batch-invariant", action="store_true",
                help="EngineConfig.batch_invariant: every row's floats those of the row alone (plain and "
                     "speculative output then equal with bfloat16 weights / KV too)")
ap.add_argument("--json", default="", help="write the τ table here")
args = ap.parse_args()
torch.set_num_threads(args.threads)
model = str(resolve_model(args.model)) if args.model else str(TARGET)
eng = Engine.from_pretrained(model, EngineConfig(model=model, cpu_weights=args.cpu_weights,
                                                 kv_dtype=args.kv_dtype,
                                                 batch_invariant=args.batch_invariant))
keys = []
if args.model and not args.folders:
    raise SystemExit("--model takes the drafter folders trained for it (EAGLE-3.1's first)")
if not args.prompts:  # this project's task: the shipped target, or another target of it (--model)
    if not args.model:
        load_drafters(eng, ASSETS)
        keys = ["eagle3.1", "pr"]
    prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
               for p in prompts_for(ops, args.per, 100 + i, eng.tokenizer, args.split)]
else:
    from gambit.tasks.benchmarks import load_gsm8k
    from gambit.train.drafter_data import chat_prompts

    qs = [it.prompt for it in load_gsm8k(args.prompts)][-args.per:]
    prompts = [eng.tokenizer.encode(p) for p in chat_prompts(model, qs)]
for path in args.folders:
    eng.register_drafter(path, load_drafter(path, eng.model))
    keys.append(path)
try:
    trees = {name: spec_from_name(name) for name in args.trees.split(",")}
except ValueError as e:
    raise SystemExit(f"--trees: {e}") from None
print(f"greedy tau, {len(prompts)} prompts, batch 1 | " + " | ".join(keys), flush=True)
table = {}
for name in args.trees.split(","):
    eng.config.spec = trees[name]
    taus = []
    t0 = time.perf_counter()
    for key in keys:
        _, _, cycles, accepted = run_once(eng, prompts, 1, key, args.max_tokens)
        taus.append((accepted + cycles) / cycles)
    table[name] = dict(zip(keys, taus, strict=True))
    print(f"{name:10s} " + "  ".join(f"{t:.3f}" for t in taus) +
          "   / first: " + " ".join(f"{t / taus[0]:.3f}" for t in taus[1:]) +
          f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
speed = {}
for name in args.trees.split(",") if args.speed else []:
    eng.config.spec = trees[name]
    for key in ["plain", *keys]:  # warm-up: first calls, buffers
        run_once(eng, prompts[:1], 1, key, 8)
    secs = {key: [] for key in ["plain", *keys]}
    same = dict.fromkeys(keys, True)  # every drafter's greedy output bitwise equal to plain decoding's
    for _ in range(args.speed):
        outs = {}
        for key in secs:
            dt, outs[key], _, _ = run_once(eng, prompts, 1, key, args.max_tokens)
            secs[key].append(dt)
        for key in keys:
            same[key] = same[key] and outs[key] == outs["plain"]
    speed[name] = {}
    for key in keys:
        r = [p / x for p, x in zip(secs["plain"], secs[key], strict=True)]
        speed[name][key] = {"speedup": statistics.median(r), "spread": [min(r), max(r)],
                            "seconds": secs[key], "plain_seconds": secs["plain"], "equals_plain": same[key]}
    print(f"{name:10s} speedup over plain, median (min-max) of {args.speed}: " + "  ".join(
        f"{v['speedup']:.2f}x ({v['spread'][0]:.2f}-{v['spread'][1]:.2f})" for v in speed[name].values()) +
        "; output equals plain decoding: " + " ".join(str(v["equals_plain"]) for v in speed[name].values()),
        flush=True)
pools = {}
if args.pool:  # the reject pool: how many rejects were reconsidered, and how many of those recovered
    for key in keys:
        a = _pool_analysis(eng, prompts, key, BASE, args.max_tokens)
        pools[key] = {k: a[k] for k in ("positions", "rejects", "unsure_share", "reconsidered_share",
                                        "recovered_of_reconsidered", "table7", "cycle_ends")}
        print(f"pool {key}: rejects {a['rejects']} of {a['positions']}, unsure (cpd < 0.5) "
              f"{a['unsure_share']:.3f}, reconsidered {a['reconsidered_share']:.3f}, recovered of those "
              f"{a['recovered_of_reconsidered'] or 0:.3f}", flush=True)
        e = a["cycle_ends"]
        print(f"cycle ends {key} ({e['cycles']} cycles): " + ", ".join(
            f"{k} {v:.3f}" for k, v in e["share"].items()) + f"; outside top-k at rank < 2k "
            f"{e['outside_within_next_k'] or 0:.3f}, median rank {e['outside_median_rank']}, "
            f"not in the draft vocabulary {e['outside_not_in_draft_vocab'] or 0:.3f}", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"model": model, "prompts": len(prompts), "max_tokens": args.max_tokens,
                   "cpu_weights": args.cpu_weights, "kv_dtype": args.kv_dtype,
                   "batch_invariant": args.batch_invariant, "tau": table,
                   "speed": speed, "pool": pools}, f, indent=1)
