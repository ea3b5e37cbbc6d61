"""One layer's attention (``PagedAttention`` as a forward builds and calls it, the shipped target's
shapes) for decode rows, draft trees and prefill chunks, through SDPA over gathered blocks and through
the CPU kernel (tree rows in its tiled order): what ``attention.kernel_serves`` decides between. Min of 5
timings of 50 calls each, 2 threads; random cache contents.

Usage: PYTHONPATH=services .venv/bin/python tools/attention_rows_cost.py [B:ROWS:CTX:tree|causal ...]
  (default: the cases in CASES)
"""
import json
import sys
import time

import torch

import gambit.engine.attention as attention
from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.kv_cache import KVCache
from gambit.model.config import ModelConfig
from gambit.paths import TARGET

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)

torch.set_num_threads(2)
raw = json.loads((TARGET / "config.json").read_text())
cfg = ModelConfig(**{k: v for k, v in raw.items() if k in ModelConfig.__dataclass_fields__})
BS = 16


def per_layer_ms(batch: int, rows: int, ctx: int, tree: bool, kernel: bool) -> float:
    nb = -(-(ctx + rows) // BS)
    cache = KVCache(cfg, batch * nb + 1, BS, torch.float32, torch.device("cpu"))
    cache.k.normal_()
    cache.v.normal_()
    mask = torch.tril(torch.ones(rows, rows, dtype=torch.bool)) if tree and rows > 1 else None
    items = [SeqInput([0] * rows, list(range(ctx, ctx + rows)), ctx,
                      list(range(1 + b * nb, 1 + (b + 1) * nb)), mask) for b in range(batch)]
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = torch.randn(1, batch * rows, H, D)
    k, v = torch.randn(1, batch * rows, Hkv, D), torch.randn(1, batch * rows, Hkv, D)
    attention.kernel_serves = (lambda items, speculative=False: True) if kernel else \
        (lambda items, speculative=False: False)

    def call():
        PagedAttention(cache, items, torch.device("cpu"), use_kernel=True, speculative=True)(0, q, k, v)

    for _ in range(5):
        call()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(50):
            call()
        best = min(best, (time.perf_counter() - t0) / 50)
    return best * 1e3


print("| batch | rows per sequence | cached keys | kind | SDPA, ms | kernel, ms | SDPA / kernel |")
print("|---:|---:|---:|---|---:|---:|---:|")
CASES = [(48, 1, 200, False), (48, 4, 200, True), (96, 4, 150, True), (16, 9, 200, True), (1, 9, 200, True),
         (4, 9, 200, True), (1, 17, 200, True), (4, 17, 200, True), (1, 49, 200, True), (4, 49, 200, True),
         (8, 6, 200, False), (1, 64, 0, False), (1, 64, 200, False),
         (4, 64, 100, False)]  # (batch, rows per sequence, cached keys, tree mask)
if len(sys.argv) > 1:
    CASES = [(int(b), int(r), int(c), kind == "tree")
             for b, r, c, kind in (a.split(":") for a in sys.argv[1:])]
for batch, rows, ctx, tree in CASES:
    s = per_layer_ms(batch, rows, ctx, tree, False)
    k = per_layer_ms(batch, rows, ctx, tree, True)
    kind = "decode" if rows == 1 else ("tree (chain mask)" if tree else "causal chunk")
    print(f"| {batch} | {rows} | {ctx} | {kind} | {s:.3f} | {k:.3f} | {s / k:.2f} |", flush=True)
