"""Where greedy speculative output parts from plain decoding on a real checkpoint, per precision: for each
of fp32, bf16 weights, bf16 KV and both, decode the last N GSM8K questions (chat template) plainly and
with a drafter, batch 1, and print how many outputs are identical and the first differing token of each.

Why: plain decoding at batch 1 runs one-row products (``cpu_gemv``) and the decode attention kernel;
verification runs multi-row products and the tree-row kernel, in other summation orders. In fp32 that
moves logits by ~1e-7; with a bfloat16 rounding in the path (the products' outputs under bf16 weights,
the keys and values the verification forward writes to a bf16 cache) a value near a rounding boundary
moves by a bfloat16 ulp, and a greedy near-tie can flip.

With ``--batch-invariant on`` (or ``both``, the default: each precision twice) the engine runs with
``EngineConfig.batch_invariant``: one order of arithmetic per row, so every output should be identical.

Usage: PYTHONPATH=services .venv/bin/python tools/spec_divergence.py DRAFTER [--model smollm2] [--per 8]
       [--tokens 96] [--prompts ../shared/datasets/gsm8k_test.jsonl] [--batch-invariant off|on|both]
       [--json FILE]
"""
import argparse
import json
import time

import torch

from gambit.bench.spec_cells import run_once
from gambit.engine import Engine, EngineConfig
from gambit.model.registry import resolve_model
from gambit.speculative import load_drafter
from gambit.tasks.benchmarks import load_gsm8k
from gambit.train.drafter_data import chat_prompts

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("drafter", help="drafter folder trained for the model (make smollm2-drafters' EAGLE-3.1)")
ap.add_argument("--model", default="smollm2", help="target model folder or registered name")
ap.add_argument("--prompts", default="../shared/datasets/gsm8k_test.jsonl", help="GSM8K-layout JSONL")
ap.add_argument("--per", type=int, default=8, help="questions (the file's last N)")
ap.add_argument("--tokens", type=int, default=96, help="new tokens per question")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--batch-invariant", default="both", choices=("off", "on", "both"),
                help="EngineConfig.batch_invariant at every precision: off, on, or both (each twice)")
ap.add_argument("--json", default="", help="write the counts, first differing tokens and seconds here")
args = ap.parse_args()
torch.set_num_threads(args.threads)
model = str(resolve_model(args.model))
PRECISIONS = [("float32", "auto"), ("bfloat16", "auto"), ("float32", "bfloat16"), ("bfloat16", "bfloat16")]
qs = [it.prompt for it in load_gsm8k(args.prompts)][-args.per:]
modes = {"off": [False], "on": [True], "both": [False, True]}[args.batch_invariant]
rows = []
for (weights, kv), inv in ((p, i) for p in PRECISIONS for i in modes):
    eng = Engine.from_pretrained(model, EngineConfig(model=model, cpu_weights=weights, kv_dtype=kv,
                                                     batch_invariant=inv))
    eng.register_drafter(args.drafter, load_drafter(args.drafter, eng.model))
    prompts = [eng.tokenizer.encode(p) for p in chat_prompts(model, qs)]
    t_plain, plain, _, _ = run_once(eng, prompts, 1, "plain", args.tokens)
    t_spec, spec, cycles, accepted = run_once(eng, prompts, 1, args.drafter, args.tokens)
    first, same = [], 0
    for a, b in zip(plain, spec, strict=True):
        a, b = list(getattr(a, "token_ids", a)), list(getattr(b, "token_ids", b))
        pairs = enumerate(zip(a, b, strict=False))
        first.append(next((i for i, (x, y) in pairs if x != y), min(len(a), len(b))))
        same += a == b  # identical, also when both stopped early (an EOS before --tokens)
    tau = (accepted + cycles) / max(cycles, 1)
    print(f"weights {weights}, KV {kv}, batch_invariant {inv}: {same}/{len(first)} outputs identical; first "
          f"differing token {first}; tau {tau:.2f}; plain {t_plain:.1f} s, speculative {t_spec:.1f} s",
          flush=True)
    rows.append({"weights": weights, "kv": kv, "batch_invariant": inv, "identical": same,
                 "outputs": len(first),
                 "first_difference": first, "tau": tau, "plain_s": t_plain, "spec_s": t_spec})
if args.json:
    with open(args.json, "w") as f:
        json.dump({"model": model, "drafter": args.drafter, "questions": args.per, "tokens": args.tokens,
                   "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "rows": rows}, f, indent=1)
