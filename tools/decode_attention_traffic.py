"""Is batched decode attention bound by reading the KV cache? ``paged_decode`` (the engine's CPU kernel)
for B sequences of L tokens, each reading its own blocks (B·L·2·Hkv·D bytes a K/V element per layer),
at the shipped target's attention shape (4 kv heads of 48, GQA 1) or SmolLM2-135M's (3 kv heads of 64,
9 query heads), over a float32 and a bfloat16 cache (``EngineConfig.kv_dtype``), timed two ways:

* ``cold``: a fresh K/V cache per call, cycled through more memory than the last-level cache holds,
  as a decode step reads its layers one after another;
* ``warm``: the same K/V on every call (cache-resident when it fits).

With ``--rows R`` (> 1) each sequence brings R new rows as a draft tree (a random causal-like mask, the
rows' keys among its L): ``paged_attention``'s tiled order, what speculative verification runs.

It prints µs per call (best of 5 rounds, the dtypes interleaved round by round), the bytes read per µs
(GB/s), and each dtype's time over float32's. ``cold`` near the machine's memory bandwidth and far above
``warm`` means the step waits for memory, and only fewer bytes (a narrower KV dtype, or blocks read once
per step however many sequences share them) make it faster.

Usage: .venv/bin/python tools/decode_attention_traffic.py [--batch 96] [--tokens 200] [--threads 2]
       [--shape target|smollm2] [--kv float32,bfloat16] [--rows 1] [--json PATH]
"""
import argparse
import json
import time

import torch

from gambit.engine import cpu_attention

SHAPES = {"target": (4, 4, 48), "smollm2": (9, 3, 64)}  # query heads, kv heads, head_dim

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--batch", type=int, default=96, help="sequences in the decode call")
ap.add_argument("--tokens", type=int, default=200, help="cached tokens per sequence")
ap.add_argument("--threads", type=int, default=2, help="torch threads the kernel splits over")
ap.add_argument("--shape", choices=sorted(SHAPES), default="target", help="attention shape (heads, head_dim)")
ap.add_argument("--kv", default="float32,bfloat16", help="comma-separated KV cache dtypes to compare")
ap.add_argument("--rows", type=int, default=1,
                help="new rows a sequence: 1 = decode (paged_decode), more = a draft tree (paged_attention)")
ap.add_argument("--json", default="", help="also write the table here (a path; empty: print only)")
args = ap.parse_args()
torch.set_num_threads(args.threads)
B, L = args.batch, args.tokens
H, Hkv, D = SHAPES[args.shape]
bs = 16
nb = (L + bs - 1) // bs
dtypes = [getattr(torch, name) for name in args.kv.split(",")]
gen = torch.Generator().manual_seed(0)
tables = torch.randperm(B * nb, generator=gen).view(B, nb)
lens = torch.full((B,), L, dtype=torch.long)
R = args.rows
if not 1 <= R <= L:
    raise SystemExit(f"--rows must be in [1, --tokens], got {R}")
q = torch.randn(B * R, H, D, generator=gen)
scale = D ** -0.5
if R > 1:  # each row sees the cached L - R keys, itself and a random subset of the rows before it
    masks = (torch.rand(B, R, R, generator=gen) < 0.3).tril() | torch.eye(R, dtype=torch.bool)
    tree = (tables, torch.full((B,), L - R), torch.arange(B) * R, torch.full((B,), R),
            torch.arange(B) * R * R, masks.reshape(-1).contiguous())


def caches_of(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    per = 2 * B * L * Hkv * D * dtype.itemsize
    copies = max(2, int(256e6 // per) + 1)  # > 256 MB in all: no cache holds them
    return [tuple(torch.randn(Hkv, B * nb, bs, D, generator=gen).to(dtype) for _ in range(2))
            for _ in range(copies)]


caches = {dt: caches_of(dt) for dt in dtypes}


def timed(dtype: torch.dtype, cold: bool, n: int = 60) -> float:
    cs = caches[dtype]
    t0 = time.perf_counter()
    for i in range(n):
        kc, vc = cs[i % len(cs)] if cold else cs[0]
        if R == 1:
            cpu_attention.paged_decode(q, kc, vc, tables, lens, scale)
        else:
            cpu_attention.paged_attention(q, kc, vc, *tree, scale)
    return (time.perf_counter() - t0) / n * 1e6


for dt in dtypes:
    timed(dt, False, 5)
best = {(dt, cold): float("inf") for dt in dtypes for cold in (True, False)}
for _ in range(5):  # rounds: every (dtype, cold) once a round
    for cold in (True, False):
        for dt in dtypes:
            best[dt, cold] = min(best[dt, cold], timed(dt, cold))
print(f"{args.shape}: B = {B} sequences x L = {L} tokens ({R} new rows each), {H} query / {Hkv} kv heads "
      f"of {D}, {args.threads} threads")
print(f"{'kv dtype':10s} {'order':6s} {'MB/call':>8s} {'µs':>8s} {'GB/s':>7s} {'x fp32':>7s}")
rows = []
for cold in (True, False):
    for dt in dtypes:
        mb = 2 * B * L * Hkv * D * dt.itemsize / 1e6
        us = best[dt, cold]
        ratio = us / best[dtypes[0], cold]
        rows.append({"kv_dtype": str(dt).removeprefix("torch."), "cold": cold, "mb": mb, "us": us,
                     "gb_s": mb / us * 1e3, "time_vs_first": ratio})
        print(f"{rows[-1]['kv_dtype']:10s} {'cold' if cold else 'warm':6s} {mb:8.1f} {us:8.0f} "
              f"{mb / us * 1e3:7.1f} {ratio:7.3f}")
if args.json:
    with open(args.json, "w") as f:
        json.dump({"shape": args.shape, "batch": B, "tokens": L, "new_rows": R, "threads": args.threads,
                   "rows": rows}, f, indent=1)
