"""Is a seeded Gambit run the same alone and beside other runs? For each engine arithmetic (default /
batch-invariant) and scorer (batched network / invariant products), run one problem alone, then with N
other runs in the same driver, and count the tree nodes whose tokens, scores or fate differ.

Why: the API promises that the same request and seed give the same traces (``SolveRequest.seed``),
but a batched product rounds a row differently at different row counts: in the engine (its hidden states
and logits) and in the scorer (a boundary's score moved in its last bits with the rest of its call, and
mean scores tied to ~1e-8 swap ranks). ``EngineConfig.batch_invariant`` and ``scoring/invariant.py``
give every row one order of arithmetic.

With ``--decoding eagle3.1|pr`` every run decodes speculatively, and each row also compares the run
alone against the same run decoded plainly: the tokens of each trace are plain decoding's (``spec.verify
"match"``), but a speculative step advances a Gambit run's Δ clock by its mean τ, so its rounds fall at
other tokens and the tree differs. Whether a step drafts depends on the whole batch (``spec.max_batch``):
``--spec-max-batch 0`` (draft at any size) keeps a speculative run the same run beside others.

Usage: PYTHONPATH=services .venv/bin/python tools/seeded_runs.py [--model smollm2] [--cpu-weights bfloat16]
       [--kv-dtype bfloat16] [--others 3] [--capacity 4] [--max-tokens 64] [--decoding pr]
       [--spec-max-batch N] [--json FILE]
"""
import argparse
import json
import time

import torch

from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.model.registry import resolve_model
from gambit.paths import TARGET
from gambit.scoring import random_scorer
from gambit.scoring.spec import load_scorer_spec
from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.tasks.arithmetic import TaskConfig, generate

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--model", default="",
                help="target model folder or registered name ('': the shipped target)")
ap.add_argument("--cpu-weights", default="float32", help="the engine's linear weights: float32 | bfloat16")
ap.add_argument("--kv-dtype", default="auto",
                help="the engine's KV cache elements: auto | float32 | bfloat16")
ap.add_argument("--others", type=int, default=3, help="other runs beside the one compared")
ap.add_argument("--capacity", type=int, default=4, help="C: traces of each run's pool")
ap.add_argument("--max-tokens", type=int, default=64, help="tokens per trace at most")
ap.add_argument("--problem-seed", type=int, default=3,
                help="seed of the test-split problems (6-8 operations)")
ap.add_argument("--decoding", default="plain", choices=("plain", "eagle3.1", "pr"),
                help="every run's decoding (speculative ones use the shipped target's drafters)")
ap.add_argument("--spec-max-batch", type=int, default=None,
                help="SpecConfig.max_batch, traces a step drafts at most (0: any; default: the CPU "
                     "vendor's, gambit.cpu_info)")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--json", default="", help="write the table here")
args = ap.parse_args()
torch.set_num_threads(args.threads)

model = str(resolve_model(args.model) if args.model else TARGET)
ecfg = dict(preemption="evict", num_blocks=64 * (1 + args.others) * args.capacity,
            cpu_weights=args.cpu_weights, kv_dtype=args.kv_dtype)
if args.spec_max_batch is not None:
    ecfg["spec"] = SpecConfig(max_batch=args.spec_max_batch)
engines = {}
problems = generate("test", 1 + args.others, args.problem_seed, TaskConfig(6, 8))


def engine(invariant: bool) -> Engine:
    if invariant not in engines:
        cfg = EngineConfig(model=model, batch_invariant=invariant, **ecfg)
        engines[invariant] = Engine.from_pretrained(model, cfg)
    first = engines[invariant]
    return Engine(first.model, first.tokenizer, first.config)  # a fresh KV cache and scheduler


def scorer(hidden: int, invariant: bool):
    s = load_scorer_spec("process", hidden, note=None, invariant=invariant)
    return s if s.hidden_size == hidden else random_scorer("mlp", hidden, invariant=invariant)


def solve(eng_inv: bool, sc_inv: bool, others: int, decoding: str = args.decoding) -> dict:
    eng = engine(eng_inv)
    drv = SearchDriver(eng, scorer(eng.model.config.hidden_size, sc_inv))
    cfg = dict(capacity=args.capacity, swap=2, warmup=8, interval=5, max_tokens=args.max_tokens,
               decoding=decoding)
    drv.submit(problems[0], SearchConfig(seed=5, **cfg), run_id="p")
    for i in range(1, others + 1):
        drv.submit(problems[i], SearchConfig(seed=i, **cfg), run_id=f"o{i}")
    drv.run_until_done()
    nodes = drv.store.load("p")["nodes"]
    return {k: {f: v for f, v in n.items() if f != "engine_id"} for k, n in nodes.items()}


rows = []
for eng_inv in (False, True):
    for sc_inv in (False, True):
        t = time.perf_counter()
        alone, crowd = solve(eng_inv, sc_inv, 0), solve(eng_inv, sc_inv, args.others)
        differ = sorted(int(k) for k in set(alone) | set(crowd) if alone.get(k) != crowd.get(k))
        rows.append({"engine": "invariant" if eng_inv else "default", "scorer": "invariant" if sc_inv else
                     "batched", "nodes": len(alone), "differ": len(differ), "first": differ[:5]})
        r = rows[-1]
        vs = ""
        if args.decoding != "plain":  # the same run alone, decoded plainly
            plain = solve(eng_inv, sc_inv, 0, "plain")
            both = set(alone) & set(plain)
            r |= {"plain_nodes": len(plain),
                  "differ_vs_plain": sum(alone.get(k) != plain.get(k) for k in set(alone) | set(plain)),
                  "tokens_differ_vs_plain": sum(alone[k]["tokens"] != plain[k]["tokens"] for k in both)}
            vs = (f"  vs plain: nodes {r['plain_nodes']:3} differ {r['differ_vs_plain']:3} tokens differ "
                  f"{r['tokens_differ_vs_plain']:3}")
        r["seconds"] = round(time.perf_counter() - t, 1)
        print(f"engine {r['engine']:9}  scorer {r['scorer']:9}  nodes {r['nodes']:3}  "
              f"differ {r['differ']:3}  first {r['first']}{vs}  ({r['seconds']} s)", flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)
