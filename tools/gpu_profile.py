"""Where a decode step's time goes on a device: torch.profiler over plain and PR greedy decoding.

The first H200 run (stop 38) decoded the shipped target at 68 tok/s at batch 1 in bf16 (~15 ms a
step, where a 6-layer model's kernels take well under 1 ms): the step is host-bound. This names the
host-side calls (copies to the device, synchronisations, Python-built tensors) that a GPU session
should remove first. On the device machine:
    PYTHONPATH=services python3 tools/gpu_profile.py --out $OUT/gpu_profile.txt
Here (the same code path, CPU torch, no C++ kernels):
    PYTHONPATH=services .venv/bin/python tools/gpu_profile.py --device cpu --tokens 16
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gambit.bench.spec import ASSETS, BASE, load_drafters, prompts_for, run_once
from gambit.engine import Engine, EngineConfig
from gambit.model.loader import load_model
from gambit.paths import TARGET


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device (default: cuda when present)")
    ap.add_argument("--dtype", default="", help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--tokens", type=int, default=48, help="tokens generated per profiled run")
    ap.add_argument("--rows", type=int, default=30, help="rows of each profile table")
    ap.add_argument("--out", default="", help="also write the report here")
    args = ap.parse_args()
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    model, tok = load_model(str(TARGET), device=args.device, dtype=dtype)
    eng = Engine(model, tok, EngineConfig(device=args.device, dtype=dtype, spec=BASE, cpu_kernel=False,
                                          num_blocks=1024))
    load_drafters(eng, ASSETS, keys=("pr",))
    prompt = prompts_for((6, 8), 1, 7, tok)
    report = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    for key in ("plain", "pr"):
        run_once(eng, prompt, 1, key, args.tokens)  # warm-up: first shapes, kernel selection
        secs, outs, cycles, acc = run_once(eng, prompt, 1, key, args.tokens)
        with profile(activities=activities) as prof:
            run_once(eng, prompt, 1, key, args.tokens)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
        n = len(outs[0])
        head = (f"== {key}: {n} tokens in {secs * 1e3:.1f} ms unprofiled ({secs / max(n, 1) * 1e3:.2f} ms a "
                f"token; {cycles} cycles, {acc} drafts accepted) on {args.device} {dtype}")
        avg = prof.key_averages()
        report += [head, "-- by self CPU time", avg.table(sort_by="self_cpu_time_total", row_limit=args.rows)]
        if args.device.startswith("cuda"):
            report += ["-- by device time", avg.table(sort_by="self_device_time_total", row_limit=args.rows)]
    text = "\n".join(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}\n{text}\n")


if __name__ == "__main__":
    main()
