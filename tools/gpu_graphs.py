"""CUDA-graph decode steps against eager ones on a GPU: the same tokens, and how much faster.

Written at stop 38 for the next GPU lease (the engine's ``decode_graphs="cuda"`` has not run on a GPU
yet). Per dtype: greedy outputs of eager and graph decoding at batch 1 and 16 (equal, or the first
differing position: bf16 reductions over a bucketed key range may round differently), then plain
decoding tok/s at each ``--batches`` size, eager and graphs interleaved ``--reps`` times (median and
spread of the per-repetition ratio). Prints a table, writes JSON; exits 1 if a float32 output differs.

On the device machine (``bash tools/gpu_run.sh`` runs it):
    PYTHONPATH=services python3 tools/gpu_graphs.py --json $OUT/gpu_graphs.json
Here, the same code without capture (``decode_graphs="static"``):
    PYTHONPATH=services .venv/bin/python tools/gpu_graphs.py --device cpu --batches 1,4 --tokens 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from gpu_check import finish, first_difference  # tools/ is the script's own folder on sys.path

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.tasks.arithmetic import TaskConfig, generate


def engine(device: str, dtype: str, mode: str) -> Engine:
    model, tok = load_model(str(TARGET), device=device, dtype=dtype)
    return Engine(model, tok, EngineConfig(device=device, dtype=dtype, cpu_kernel=False, num_blocks=8192,
                                           max_num_seqs=512, decode_graphs=mode))


def timed(eng: Engine, prompts, tokens: int, device: str) -> float:
    sp = SamplingParams(temperature=0.8, max_tokens=tokens, ignore_eos=True, seed=1)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    eng.generate(prompts, sp)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device (default: cuda when present)")
    ap.add_argument("--dtypes", default="", help="comma-separated; default float32,bfloat16 on CUDA")
    ap.add_argument("--batches", default="1,16,64,256", help="batch sizes to time, comma-separated")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per trace")
    ap.add_argument("--reps", type=int, default=3, help="interleaved timing repetitions")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    mode = "cuda" if cuda else "static"
    dtypes = args.dtypes.split(",") if args.dtypes else (["float32", "bfloat16"] if cuda else ["float32"])
    batches = [int(b) for b in args.batches.split(",")]
    results, ok = {"device": args.device, "mode": mode, "torch": torch.__version__, "dtypes": {}}, True
    for dtype in dtypes:
        eager, graphs = engine(args.device, dtype, "off"), engine(args.device, dtype, mode)
        tok = eager.tokenizer
        pool = [tok.encode(p.prompt) for p in generate("test", max(batches + [16]), 9, TaskConfig(2, 8))]
        greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        r: dict = {"equal": {}, "speed": {}}
        for b in (1, 16):
            a, g = eager.generate(pool[:b], greedy), graphs.generate(pool[:b], greedy)
            diffs = [first_difference(x, y) for x, y in zip(a, g, strict=True)]
            r["equal"][b] = {"equal": sum(d is None for d in diffs), "of": b,
                             "first_differences": [d for d in diffs if d is not None]}
            ok &= dtype != "float32" or all(d is None for d in diffs)
            print(f"{dtype} batch {b}: graph decoding equal to eager on {r['equal'][b]['equal']}/{b} traces "
                  f"(first differences at {r['equal'][b]['first_differences']})", flush=True)
        for b in batches:
            prompts = pool[:b]
            timed(eager, prompts, 8, args.device)  # warm-up; the graph side captures its buckets here
            timed(graphs, prompts, args.tokens, args.device)
            te, tg = [], []
            for _ in range(args.reps):
                te.append(timed(eager, prompts, args.tokens, args.device))
                tg.append(timed(graphs, prompts, args.tokens, args.device))
            ratio = [e / g for e, g in zip(te, tg, strict=True)]
            r["speed"][b] = {"eager_tok_s": b * args.tokens / statistics.median(te),
                             "graphs_tok_s": b * args.tokens / statistics.median(tg),
                             "speedup": statistics.median(ratio), "spread": [min(ratio), max(ratio)],
                             "graphs_captured": len(graphs.runner.graphs.steps)}
            s = r["speed"][b]
            print(f"{dtype} batch {b:>4}: eager {s['eager_tok_s']:8.0f} tok/s, graphs "
                  f"{s['graphs_tok_s']:8.0f} tok/s: {s['speedup']:.2f}x ({s['spread'][0]:.2f}-"
                  f"{s['spread'][1]:.2f})", flush=True)
        results["dtypes"][dtype] = r
    results["float32_equal"] = ok
    finish(results, args.json, ok)


if __name__ == "__main__":
    main()
