"""One draw of the Python sampler (``sampler.sample``) against the compiled one (``cpu_sampler.sample``)
at B rows of V symbols (T = 0.8, no top-k/top-p), interleaved, REPS rounds of N calls each; median
and range of µs per draw, and whether the tokens agree.

Usage: .venv/bin/python tools/sampler_speed.py [B] [V] [REPS]   (default 96 100 5; 2 threads)
"""
import statistics
import sys
import time

import torch

from gambit.engine import cpu_sampler
from gambit.engine.sampler import SamplingBatch, sample

B = int(sys.argv[1]) if len(sys.argv) > 1 else 96
V = int(sys.argv[2]) if len(sys.argv) > 2 else 100
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(2)
logits = torch.randn(B, V, generator=torch.Generator().manual_seed(0))
sb = SamplingBatch.build([0.8] * B, [0] * B, [1.0] * B, list(range(B)), [50] * B, torch.device("cpu"))
n = max(10, 30_000 // V)
times: dict[str, list[float]] = {"python": [], "compiled": []}
same = torch.equal(sample(logits.clone(), sb), cpu_sampler.sample(logits.clone(), sb))
for _ in range(reps):
    for name, f in (("python", sample), ("compiled", cpu_sampler.sample)):
        for _ in range(3):
            f(logits.clone(), sb)
        t = time.perf_counter()
        for _ in range(n):
            f(logits.clone(), sb)
        times[name].append(1e6 * (time.perf_counter() - t) / n)
for name, ts in times.items():
    print(f"{name}: {statistics.median(ts):.1f} µs per draw ({min(ts):.1f}-{max(ts):.1f}), B={B} V={V}")
print(f"same tokens: {same}")
