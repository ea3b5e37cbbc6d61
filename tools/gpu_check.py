"""The checks a session with a GPU runs first: the engine and speculative decoding on CUDA, in minutes.

On the device machine (its python3 holds a CUDA torch; nothing to install):
    PYTHONPATH=services python3 tools/gpu_check.py --json $OUT/gpu_check.json
Here, without a GPU, the same checks on the CPU's torch path (no C++ kernels), as on a GPU:
    PYTHONPATH=services .venv/bin/python tools/gpu_check.py --device cpu --quick

The shipped target and drafters travel with the working tree (no download). Per dtype (float32, and
bfloat16 on CUDA):
1. Plain greedy decoding on the device against the CPU's float32 reference (same prompts): outputs
   equal, and where not, the first differing position (float rounding differs between devices).
2. Lossless: EAGLE-3.1 and PR greedy outputs equal plain greedy on the same device and dtype, at
   batch 1 and batch 8, at the paper's tree (B = 48, gamma 8, Bw = k = 6, m = 3) and the engine's.
3. Speed at batch 1: plain, EAGLE-3.1 and PR interleaved ``--reps`` times (a warm-up first);
   speedup = plain seconds / speculative seconds within a repetition, median and spread; tau.
Prints a table, writes JSON, and exits 1 if any output was not lossless.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from gambit.bench.spec import ASSETS, BASE, SPLITS, load_drafters, prompts_for, run_once
from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.model.loader import load_model
from gambit.paths import TARGET

TREES = {"paper (B=48)": BASE, "engine defaults": SpecConfig(max_batch=0)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def finish(results: dict, json_path: str, ok: bool) -> None:
    """Write the results JSON (if asked) and exit 0 only if every check held (what gpu_run.sh reads)."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {json_path}")
    raise SystemExit(0 if ok else 1)


def check_dtype(device: str, dtype: str, prompts, ref: list, args) -> dict:
    model, tok = load_model(str(TARGET), device=device, dtype=dtype)
    eng = Engine(model, tok, EngineConfig(device=device, dtype=dtype, spec=BASE, cpu_kernel=False))
    load_drafters(eng, ASSETS, keys=("eagle3.1", "pr"))  # the budget reserves two drafter caches
    out: dict = {"device": str(eng.device), "dtype": str(eng.dtype)}
    _, plain, _, _ = run_once(eng, prompts, 1, "plain", args.max_tokens)
    diffs = [first_difference(p, r) for p, r in zip(plain, ref, strict=True)]
    out["plain_equal_to_cpu_fp32"] = sum(d is None for d in diffs)
    out["plain_first_difference"] = [d for d in diffs if d is not None]
    _, plain8, _, _ = run_once(eng, prompts, 8, "plain", args.max_tokens)
    out["plain_batch8_equal_batch1"] = plain8 == plain
    lossless, tau = {}, {}
    for tree, spec in TREES.items():
        eng.config.spec = replace(spec, max_batch=0)
        for key in ("eagle3.1", "pr"):
            for batch in (1, 8):
                _, outs, cycles, accepted = run_once(eng, prompts, batch, key, args.max_tokens)
                lossless[f"{tree} / {key} / batch {batch}"] = outs == plain
                if batch == 1:
                    tau[f"{tree} / {key}"] = (accepted + cycles) / max(cycles, 1)
    out["lossless"], out["tau"] = lossless, tau
    speed = {}
    for tree, spec in TREES.items():
        eng.config.spec = replace(spec, max_batch=0)
        keys = ("plain", "eagle3.1", "pr")
        for key in keys:  # warm-up: first calls, allocations, kernel selection
            run_once(eng, prompts[:1], 1, key, 8)
        secs: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(args.reps):
            for key in keys:
                secs[key].append(run_once(eng, prompts, 1, key, args.max_tokens)[0])
        for key in keys[1:]:
            r = [p / s for p, s in zip(secs["plain"], secs[key], strict=True)]
            speed[f"{tree} / {key}"] = {"speedup": statistics.median(r), "spread": [min(r), max(r)],
                                        "seconds": secs[key], "plain_seconds": secs["plain"]}
    out["speed_batch1"] = speed
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device to check (default: cuda when present)")
    ap.add_argument("--dtypes", default="", help="comma-separated; default float32,bfloat16 on CUDA, "
                    "float32 on the CPU")
    ap.add_argument("--per", type=int, default=4, help="test prompts per difficulty split")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--reps", type=int, default=3, help="interleaved timing repetitions")
    ap.add_argument("--quick", action="store_true", help="1 prompt per split, 24 tokens, 1 repetition")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args()
    if args.quick:
        args.per, args.max_tokens, args.reps = 1, 24, 1
    dtypes = args.dtypes.split(",") if args.dtypes else (
        ["float32", "bfloat16"] if args.device.startswith("cuda") else ["float32"])
    t0 = time.perf_counter()
    cpu_model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
    prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
               for p in prompts_for(ops, args.per, 100 + i, tok)]
    # the reference on the CPU's torch path too: no C++ kernel to compile on the device machine
    cpu = Engine(cpu_model, tok, EngineConfig(device="cpu", dtype="float32", cpu_kernel=False))
    _, ref, _, _ = run_once(cpu, prompts, 1, "plain", args.max_tokens)
    results = {"torch": torch.__version__, "prompts": len(prompts), "max_tokens": args.max_tokens,
               "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None, "checks": {}}
    ok = True
    for dtype in dtypes:
        r = check_dtype(args.device, dtype, prompts, ref, args)
        results["checks"][dtype] = r
        ok &= all(r["lossless"].values()) and r["plain_batch8_equal_batch1"]
        print(f"\n{r['device']} {r['dtype']}: plain greedy equal to the CPU's float32 on "
              f"{r['plain_equal_to_cpu_fp32']}/{len(prompts)} prompts (first differences at "
              f"{r['plain_first_difference']}); batch 8 = batch 1: {r['plain_batch8_equal_batch1']}")
        print("lossless: " + ", ".join(f"{k} {v}" for k, v in r["lossless"].items()))
        for k, v in r["speed_batch1"].items():
            print(f"  {k:28s} tau {r['tau'][k]:.2f}  speedup over plain {v['speedup']:.2f}x "
                  f"({v['spread'][0]:.2f}-{v['spread'][1]:.2f})")
    results["lossless"] = ok
    print(f"\nall lossless: {ok}; {time.perf_counter() - t0:.0f} s")
    finish(results, args.json, ok)


if __name__ == "__main__":
    main()
