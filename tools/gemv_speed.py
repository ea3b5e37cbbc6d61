"""One-row products of fp32 and bfloat16 weights (``gambit.engine.cpu_gemv``) at SmolLM2-135M's shapes,
read cold: each timed pass multiplies many distinct weights (far more bytes than the caches hold), as a
batch-1 decode step does. Prints µs a call and GB/s of weights read, beside a plain ``x.sum()`` over
512 MiB (what this machine streams).

Usage: PYTHONPATH=services .venv/bin/python tools/gemv_speed.py [--threads N] [--reps N]
"""

from __future__ import annotations

import argparse
import time

import torch

from gambit.engine.cpu_gemv import gemv

# [in, out] (the transposed layout the engine streams) and how many distinct copies a pass reads
SHAPES = {"qkv": ((576, 960), 200), "o": ((576, 576), 300), "gate_up": ((576, 3072), 60),
          "down": ((1536, 576), 200), "head": ((576, 49152), 6)}


def best_pass(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--reps", type=int, default=5, help="timed passes per shape and dtype (best kept)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    a = torch.ones(512 * 2**20 // 4)
    stream = a.numel() * 4 / best_pass(a.sum, args.reps) / 1e9
    print(f"x.sum() over 512 MiB: {stream:.1f} GB/s ({args.threads} threads)")
    print(f"{'weight':>8} {'[in, out]':>13} | {'fp32 us':>8} {'GB/s':>5} | {'bf16 us':>8} {'GB/s':>5} | "
          "time bf16/fp32")
    for name, ((n_in, n_out), copies) in SHAPES.items():
        g = torch.Generator().manual_seed(n_out)
        ws = [torch.randn(n_in, n_out, generator=g) * 0.05 for _ in range(copies)]
        x = torch.randn(1, n_in, generator=g)
        row = []
        for dtype in (torch.float32, torch.bfloat16):
            wd = [w.to(dtype) for w in ws]
            t = best_pass(lambda wd=wd, x=x: [gemv(x, w) for w in wd], args.reps) / copies
            row.append((t * 1e6, n_in * n_out * wd[0].element_size() / t / 1e9))
        (t32, g32), (t16, g16) = row
        print(f"{name:>8} {str([n_in, n_out]):>13} | {t32:8.0f} {g32:5.1f} | {t16:8.0f} {g16:5.1f} | "
              f"{t16 / t32:.2f}")


if __name__ == "__main__":
    main()
