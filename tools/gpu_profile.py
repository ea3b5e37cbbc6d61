"""Where a decode step's time goes on a device: torch.profiler over plain and PR greedy decoding.

On the first H200 run (stop 38) a plain bf16 decode step of the shipped target took 3.7 ms at batch 1
where its kernels take ~0.35 ms: host-bound (~200 launches, 16 stream synchronisations a step). This
counts those calls per token, ranks the host-side ops, and profiles plain decoding with its steps as
CUDA graphs (``decode_graphs="cuda"``) beside the eager one. On the device machine:
    PYTHONPATH=services python3 tools/gpu_profile.py --out $OUT/gpu_profile.txt
Here (the same code path, CPU torch, no C++ kernels):
    PYTHONPATH=services .venv/bin/python tools/gpu_profile.py --device cpu --tokens 16
Bad flags (``--tokens 0``, ``--out`` naming a folder or an unwritable place, ``--device cuda`` without a
GPU) are refused before the model loads.
"""

from __future__ import annotations

import argparse
import time

import torch
from gpu_check import check_device, check_out, positive  # tools/ is the script's own folder on sys.path
from torch.profiler import ProfilerActivity, profile

from gambit.bench.spec_cells import BASE, load_drafters, prompts_for, run_once
from gambit.engine import Engine, EngineConfig
from gambit.model.loader import load_model
from gambit.paths import ASSETS, TARGET

# host-side CUDA calls counted per generated token (torch.profiler's CPU events)
COUNTED = {"kernel launches": ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"),
           "graph replays": ("cudaGraphLaunch",), "stream syncs": ("cudaStreamSynchronize",),
           "memcpys": ("cudaMemcpyAsync",)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device (default: cuda when present)")
    ap.add_argument("--dtype", default="", help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--tokens", type=positive, default=48, help="tokens generated per profiled run")
    ap.add_argument("--rows", type=positive, default=30, help="rows of each profile table")
    ap.add_argument("--out", default="", help="also write the report here")
    args = ap.parse_args()
    check_device(ap, args.device)
    check_out(ap, "--out", args.out)
    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    model, tok = load_model(str(TARGET), device=args.device, dtype=dtype)
    cuda = args.device.startswith("cuda")

    def engine(graphs: str) -> Engine:
        return Engine(model, tok, EngineConfig(device=args.device, dtype=dtype, spec=BASE, cpu_kernel=False,
                                               num_blocks=1024, decode_graphs=graphs))

    eng = engine("off")
    load_drafters(eng, ASSETS, keys=("pr",))
    prompt = prompts_for((6, 8), 1, 7, tok)
    report = []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    runs = [("plain", eng, ""), ("pr", eng, "")]
    if cuda:  # the same plain decoding with its steps as CUDA graphs (EngineConfig.decode_graphs)
        runs.append(("plain", engine("cuda"), " (decode graphs)"))
    for key, e, label in runs:
        run_once(e, prompt, 1, key, args.tokens)  # warm-up: first shapes, kernel selection, captures
        secs, outs, cycles, acc = run_once(e, prompt, 1, key, args.tokens)
        with profile(activities=activities) as prof:
            run_once(e, prompt, 1, key, args.tokens)
            if cuda:
                torch.cuda.synchronize()
        n = max(len(outs[0]), 1)
        avg = prof.key_averages()
        count = {x.key: x.count for x in avg}
        per = {name: sum(count.get(k, 0) for k in keys) / n for name, keys in COUNTED.items()}
        per["aten calls (nested too)"] = sum(c for k, c in count.items() if k.startswith("aten::")) / n
        report += [f"== {key}{label}: {n} tokens in {secs * 1e3:.1f} ms unprofiled ({secs / n * 1e3:.2f} ms "
                   f"a token; {cycles} cycles, {acc} drafts accepted) on {args.device} {dtype}",
                   "   per token: " + ", ".join(f"{v:.1f} {k}" for k, v in per.items()),
                   "-- by self CPU time", avg.table(sort_by="self_cpu_time_total", row_limit=args.rows)]
        if cuda:
            report += ["-- by device time", avg.table(sort_by="self_device_time_total", row_limit=args.rows)]
    text = "\n".join(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}\n{text}\n")


if __name__ == "__main__":
    main()
