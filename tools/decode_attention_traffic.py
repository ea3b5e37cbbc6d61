"""Is batched decode attention bound by reading the KV cache? ``paged_decode`` (the engine's CPU kernel)
at the shipped target's attention shape (4 heads of 48, 16-token blocks) for B sequences of L tokens,
each reading its own blocks (B·L·2·H·D·4 bytes of K and V per layer), timed two ways:

* ``cold``: a fresh K/V cache per call, cycled through more memory than the last-level cache holds,
  as a decode step reads its layers one after another;
* ``warm``: the same K/V on every call (cache-resident when it fits).

It prints µs per call and the bytes read per µs (GB/s). ``cold`` near the machine's memory bandwidth
and far above ``warm`` means the step waits for memory, and only fewer bytes (a narrower KV dtype, or
blocks read once per step however many sequences share them) make it faster.

Usage: .venv/bin/python tools/decode_attention_traffic.py [B] [L] [THREADS]   (defaults 96 200 2)
"""
import sys
import time

import torch

from gambit.engine import cpu_attention

B = int(sys.argv[1]) if len(sys.argv) > 1 else 96
L = int(sys.argv[2]) if len(sys.argv) > 2 else 200
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
H, D, bs = 4, 48, 16
nb = (L + bs - 1) // bs
bytes_kv = 2 * B * L * H * D * 4
copies = max(2, int(256e6 // bytes_kv) + 1)  # > 256 MB in all: no cache holds them
gen = torch.Generator().manual_seed(0)
caches = [(torch.randn(H, B * nb, bs, D, generator=gen), torch.randn(H, B * nb, bs, D, generator=gen))
          for _ in range(copies)]
tables = torch.randperm(B * nb, generator=gen).view(B, nb)
lens = torch.full((B,), L, dtype=torch.long)
q = torch.randn(B, H, D, generator=gen)
scale = D ** -0.5


def per_call(cold: bool, n: int = 60) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(n):
            kc, vc = caches[i % copies] if cold else caches[0]
            cpu_attention.paged_decode(q, kc, vc, tables, lens, scale)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


per_call(False, 5)
print(f"B = {B} sequences x L = {L} tokens, {H} heads of {D}: {bytes_kv / 1e6:.1f} MB of K and V per call")
for name, cold in (("cold (fresh K/V each call)", True), ("warm (the same K/V)", False)):
    us = per_call(cold)
    print(f"{name:28s} {us:8.0f} µs  {bytes_kv / us / 1e3:6.1f} GB/s")
