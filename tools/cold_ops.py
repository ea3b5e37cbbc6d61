"""What a small host-side operation costs warm, and cold after a forward-sized sweep of memory.

Usage: PYTHONPATH=services .venv/bin/python tools/cold_ops.py [TRASH_MB] [REPS]

A search step's forward reads every weight and every resident trace's KV (on the shipped target at 96
traces x 60 tokens, ~10 MB of weights and ~50 MB of KV), more than this machine's L3, so the
tournament's Python and ATen code paths that run after it start from DRAM each step. This prints, per
operation, the median time warm (the call repeated) and cold (each call after adding 1 to a
TRASH_MB tensor, default 64), for the operations one guidance sync makes. It explains why the
tournament's per-step cost in a run is several times what the same calls take in a loop.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

if {"-h", "--help"} & set(sys.argv[1:]):  # the usage (the positional form read "--help" as a value)
    print(__doc__)
    sys.exit(0)


def main(argv: list[str]) -> int:
    trash_mb = int(argv[0]) if argv else 64
    reps = int(argv[1]) if len(argv) > 1 else 40
    from gambit.scoring.spec import load_scorer_spec

    torch.set_num_threads(2)
    scorer = load_scorer_spec("process", 192, note=None)
    x = torch.randn(53, scorer.input_size)  # a round's boundary rows (6 runs x C = 16, one boundary each)
    keys = [f"k{i}" for i in range(len(x))]
    rows = [torch.randn(192) for _ in range(len(x))]
    big = torch.zeros(trash_mb * 2**20 // 4)
    ops = {
        "no-op (timer)": lambda: None,
        "torch.stack of 53 rows": lambda: torch.stack(rows),
        "x.detach().to(float32)": lambda: x.detach().to("cpu", torch.float32),
        "numpy isfinite(x).all()": lambda: np.isfinite(x.numpy()).all(),
        "scorer.check_states(x)": lambda: scorer.check_states(x),
        "scorer.score(keys, x)": lambda: scorer.score(keys, x),
    }
    print(f"{'operation':28s} {'warm us':>9s} {'cold us':>9s}  (cold: after touching {trash_mb} MB)")
    for name, fn in ops.items():
        for _ in range(5):
            fn()
        warm, cold = [], []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            warm.append(time.perf_counter() - t)
        for _ in range(reps):
            big.add_(1.0)
            t = time.perf_counter()
            fn()
            cold.append(time.perf_counter() - t)
        print(f"{name:28s} {1e6 * statistics.median(warm):9.1f} {1e6 * statistics.median(cold):9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
