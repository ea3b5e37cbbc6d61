"""The batch-invariant products (engine/cpu_invariant.py) against the paths they replace, at SmolLM2-135M's
shapes: warm, each weight alone at 1-48 rows (one row: ``cpu_gemv``; more: oneDNN's packed GEMM, what the
default engine runs on AMD), and cold, one model's worth of products at one row (30 layers of qkv, o,
gate_up, down and the LM head: 270 MB in bfloat16, 540 MB in fp32, more than any cache), interleaved.

Usage: PYTHONPATH=services .venv/bin/python tools/invariant_linear_speed.py [--dtype bfloat16|float32]
       [--reps 7] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.engine import cpu_gemv, cpu_invariant

# (in, out): qkv, o, gate_up, down, LM head
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)]
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="weight precision")
ap.add_argument("--reps", type=int, default=7, help="interleaved repetitions (warm: calls a timing)")
ap.add_argument("--threads", type=int, default=2, help="torch threads")
ap.add_argument("--json", default="", help="write the rows here")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
bf16 = args.dtype == "bfloat16"


def weight(n_in: int, n_out: int):
    """(invariant pack, the default engine's one-row stream, its multi-row product)."""
    w = torch.randn(n_out, n_in) * n_in ** -0.5
    if bf16:
        w = w.bfloat16().float()
    packed = torch.ops.mkldnn._reorder_linear_weight(w.bfloat16() if bf16 else w, 16)
    if bf16:
        def multi(x):
            return torch.ops.mkldnn._linear_pointwise(x.bfloat16(), packed, None, "none", [], "").float()
    else:
        def multi(x):
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    stream = w.t().contiguous().bfloat16() if bf16 else w.t().contiguous()
    return cpu_invariant.pack(w.t(), bf16), stream, multi


def median_us(fn, reps: int, inner: int = 20) -> float:
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner * 1e6)
    return statistics.median(out)


rows = []
for n_in, n_out in SHAPES:
    packed, stream, multi = weight(n_in, n_out)
    for m in (1, 4, 16, 48):
        x = torch.randn(m, n_in)
        inv = median_us(lambda x=x, p=packed, n=n_out: cpu_invariant.linear(x, p, n), args.reps)
        one = lambda x=x, s=stream: cpu_gemv.gemv(x, s)  # noqa: E731
        ref = median_us(one if m == 1 else (lambda x=x, f=multi: f(x)), args.reps)
        rows.append({"in": n_in, "out": n_out, "rows": m, "invariant_us": inv, "default_us": ref,
                     "default": "cpu_gemv" if m == 1 else "onednn", "ratio": inv / ref})
        print(f"warm {n_in:5d} x {n_out:5d}, {m:2d} rows: invariant {inv:8.0f} us, default "
              f"({rows[-1]['default']}) {ref:8.0f} us, ratio {inv / ref:.2f}", flush=True)
model = [weight(*s) for s in SHAPES[:4] for _ in range(30)] + [weight(*SHAPES[4])]
xs = {576: torch.randn(1, 576), 1536: torch.randn(1, 1536)}
passes = {"invariant": [], "cpu_gemv": []}
for r in range(args.reps + 2):  # the first two (one of each order) are warm-up
    for name in ("invariant", "cpu_gemv") if r % 2 == 0 else ("cpu_gemv", "invariant"):
        t0 = time.perf_counter()
        for packed, stream, _ in model:
            x = xs[stream.shape[0]]
            if name == "invariant":
                cpu_invariant.linear(x, packed, stream.shape[1])
            else:
                cpu_gemv.gemv(x, stream)
        passes[name].append(time.perf_counter() - t0)
nbytes = sum(s.numel() * s.element_size() for _, s, _ in model)
cold = {k: statistics.median(v[2:]) * 1e3 for k, v in passes.items()}
print(f"cold one-row pass ({nbytes / 1e6:.0f} MB): invariant {cold['invariant']:.2f} ms "
      f"({nbytes / cold['invariant'] / 1e6:.1f} GB/s), cpu_gemv {cold['cpu_gemv']:.2f} ms "
      f"({nbytes / cold['cpu_gemv'] / 1e6:.1f} GB/s), ratio {cold['invariant'] / cold['cpu_gemv']:.2f}",
      flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"dtype": args.dtype, "threads": args.threads, "reps": args.reps, "warm": rows,
                   "cold_ms": cold, "cold_bytes": nbytes, "cold_passes_s": passes}, f, indent=1)
