"""Decode-step time of the bare engine by batch size at each thread count, and what the engine's
``min_rows_per_thread`` policy picks: the measurement behind ``gambit.engine.step_threads``.

Each batch size runs every thread count in turn, the order alternating each repetition; the median
per-step time of 30 decode steps (after 3 warm-up steps) is reported.

Usage: .venv/bin/python tools/step_threads_curve.py [REPS] [--model smollm2] [--json FILE]
"""
import argparse
import json
import statistics
import time

import torch

from gambit.engine.config import EngineConfig
from gambit.engine.engine import Engine
from gambit.engine.sequence import SamplingParams
from gambit.engine.step_threads import StepThreads, macs_per_row
from gambit.model.registry import resolve_model
from gambit.paths import TARGET

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
PROMPT = "Compute: 3*4+5*6-7*2+8*9 ="


def step_ms(engine: Engine, batch: int, seed: int, steps: int = 30) -> float:
    ids = [engine.add(PROMPT, SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=True,
                                             seed=seed + i)) for i in range(batch)]
    for _ in range(3):
        engine.step()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    dt = (time.perf_counter() - t) / steps
    for i in ids:
        if i in engine.traces:
            engine.abort(i)
    return 1e3 * dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reps", nargs="?", type=int, default=5, help="repetitions (the median is reported)")
    ap.add_argument("--model", default="", help='model folder or name ("" = shipped target)')
    ap.add_argument("--json", default="", help="write the table here")
    args = ap.parse_args()
    full = torch.get_num_threads()
    counts = list(range(1, full + 1))
    engine = Engine.from_pretrained(str(resolve_model(args.model or TARGET)),
                                    EngineConfig(num_blocks=4096, min_macs_per_thread=0))
    policy = StepThreads(macs_per_row(engine.model.config), EngineConfig().min_macs_per_thread)
    times: dict[tuple[int, int], list[float]] = {}
    for rep in range(args.reps):
        for b in BATCHES:
            for n in (counts if rep % 2 == 0 else counts[::-1]):
                torch.set_num_threads(n)
                times.setdefault((b, n), []).append(step_ms(engine, b, 1000 * rep))
        print(f"rep {rep + 1}/{args.reps}", flush=True)
    torch.set_num_threads(full)
    rows = []
    print(f"\n{policy.macs_per_row:,} multiply-adds a row, min_macs_per_thread {policy.min_macs:,}")
    print(f"| batch | {' | '.join(f'{n} thread(s) ms' for n in counts)} | best | policy |")
    print("|---:|" + "---:|" * (len(counts) + 2))
    for b in BATCHES:
        med = {n: statistics.median(times[(b, n)]) for n in counts}
        best = min(med, key=med.get)
        pick = policy.count(b, full)
        rows.append({"batch": b, "ms": med, "best": best, "policy": pick})
        print(f"| {b} | {' | '.join(f'{med[n]:.3f}' for n in counts)} | {best} | {pick} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": full, "macs_per_row": policy.macs_per_row,
                       "min_macs_per_thread": policy.min_macs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
