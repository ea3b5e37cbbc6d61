"""CUDA-graph decode steps against eager ones on a GPU: the same tokens, and how much faster.

Written at stop 38 for the next GPU lease (the engine's ``decode_graphs="cuda"`` has not run on a GPU
yet). Per dtype: greedy outputs of eager and graph decoding at batch 1 and 16 (equal, or the first
differing position: bf16 reductions over a bucketed key range may round differently); on CUDA also
against the same static-shape step run without capture (``decode_graphs="static"``): graphs = static
isolates capture, static = eager the padding to a block bucket. Then plain decoding tok/s at each
``--batches`` size, eager and graphs interleaved ``--reps`` times: tok/s from each side's median time,
speedup = the ratio of those same medians, with the range of the per-repetition ratios beside it.
Prints a table, writes JSON after each part (a time limit keeps what ran); exits 1 if a float32 graph
output differs from eager. Bad flags are refused before any model loads.

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
from gpu_check import (  # tools/ is the script's own folder on sys.path
    check_device,
    check_out,
    finish,
    first_difference,
    positive,
    positives,
    save,
)

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.model.loader import load_model
from gambit.paths import TARGET
from gambit.tasks.arithmetic import TaskConfig, generate


def engine(device: str, dtype: str, mode: str, rows: int) -> Engine:
    """An engine for ``rows`` traces at once. On CUDA 8192 KV blocks; on the CPU only the blocks those
    traces can fill (each up to the context length): zeroing 8192 blocks took ~1 s an engine there."""
    model, tok = load_model(str(TARGET), device=device, dtype=dtype)
    blocks = 8192
    if not device.startswith("cuda"):
        per_trace = -(-model.config.max_position_embeddings // EngineConfig.block_size)
        blocks = min(blocks, rows * per_trace)
    return Engine(model, tok, EngineConfig(device=device, dtype=dtype, cpu_kernel=False, num_blocks=blocks,
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


def speed(tokens: int, te: list[float], tg: list[float]) -> dict:
    """tok/s of each side from its median time and speedup = the ratio of those same two medians (the
    median of per-repetition ratios once disagreed with the tok/s printed beside it on which side was
    faster); the per-repetition ratios' range beside it."""
    ratio = [e / g for e, g in zip(te, tg, strict=True)]
    me, mg = statistics.median(te), statistics.median(tg)
    return {"eager_tok_s": tokens / me, "graphs_tok_s": tokens / mg, "speedup": me / mg,
            "per_rep_ratio_range": [min(ratio), max(ratio)], "eager_seconds": te, "graphs_seconds": tg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device (default: cuda when present)")
    ap.add_argument("--dtypes", default="", help="comma-separated; default float32,bfloat16 on CUDA")
    ap.add_argument("--batches", type=positives, default=[1, 16, 64, 256],
                    help="batch sizes to time, comma-separated (default 1,16,64,256)")
    ap.add_argument("--tokens", type=positive, default=64, help="tokens generated per trace")
    ap.add_argument("--reps", type=positive, default=3, help="interleaved timing repetitions")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    check_device(ap, args.device)
    check_out(ap, "--json", args.json)
    cuda = args.device.startswith("cuda")
    mode = "cuda" if cuda else "static"
    dtypes = args.dtypes.split(",") if args.dtypes else (["float32", "bfloat16"] if cuda else ["float32"])
    batches = args.batches
    results = {"device": args.device, "mode": mode, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if cuda else None, "complete": False, "dtypes": {}}
    print(f"torch {torch.__version__}, {args.device} ({results['gpu'] or 'no GPU'}), mode {mode}", flush=True)
    ok = True
    for dtype in dtypes:
        rows = max(batches + [16])  # the widest batch: timed, or the equality check's 16
        eager, graphs = engine(args.device, dtype, "off", rows), engine(args.device, dtype, mode, rows)
        static = engine(args.device, dtype, "static", rows) if cuda else None  # the same step, not captured
        tok = eager.tokenizer
        pool = [tok.encode(p.prompt) for p in generate("test", rows, 9, TaskConfig(2, 8))]
        greedy = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        r: dict = {"equal": {}, "speed": {}}
        results["dtypes"][dtype] = r
        for b in (1, 16):
            a, g = eager.generate(pool[:b], greedy), graphs.generate(pool[:b], greedy)
            diffs = [first_difference(x, y) for x, y in zip(a, g, strict=True)]
            r["equal"][b] = {"equal": sum(d is None for d in diffs), "of": b,
                             "first_differences": [d for d in diffs if d is not None]}
            ok &= dtype != "float32" or all(d is None for d in diffs)
            line = (f"{dtype} batch {b}: graph decoding equal to eager on {r['equal'][b]['equal']}/{b} "
                    f"traces (first differences at {r['equal'][b]['first_differences']})")
            if static is not None:
                st = static.generate(pool[:b], greedy)
                r["equal"][b]["graphs_equal_static"] = sum(x == y for x, y in zip(g, st, strict=True))
                r["equal"][b]["static_equal_eager"] = sum(x == y for x, y in zip(st, a, strict=True))
                line += (f"; graphs = static (capture) on {r['equal'][b]['graphs_equal_static']}/{b}, "
                         f"static = eager (padding) on {r['equal'][b]['static_equal_eager']}/{b}")
            print(line, flush=True)
            save(results, args.json)
        del static
        for b in batches:
            prompts = pool[:b]
            timed(eager, prompts, 8, args.device)  # warm-up; the graph side captures its buckets here
            timed(graphs, prompts, args.tokens, args.device)
            te, tg = [], []
            for _ in range(args.reps):
                te.append(timed(eager, prompts, args.tokens, args.device))
                tg.append(timed(graphs, prompts, args.tokens, args.device))
            s = r["speed"][b] = speed(b * args.tokens, te, tg)
            s["graphs_captured"] = len(graphs.runner.graphs.steps)
            print(f"{dtype} batch {b:>4}: eager {s['eager_tok_s']:8.0f} tok/s, graphs "
                  f"{s['graphs_tok_s']:8.0f} tok/s (medians of {args.reps}): {s['speedup']:.2f}x; per-"
                  f"repetition ratios {s['per_rep_ratio_range'][0]:.2f}-{s['per_rep_ratio_range'][1]:.2f}",
                  flush=True)
            save(results, args.json)
    results["float32_equal"] = ok
    finish(results, args.json, ok)


if __name__ == "__main__":
    main()
