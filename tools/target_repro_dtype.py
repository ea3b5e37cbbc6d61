"""The shipped target's first training steps under each arithmetic and thread count, each in its own
process: does the loss history (the card's 5 digits) depend on the thread count?

``gambit train target`` in float32 (the shipped card's) parts by thread count past the learning-rate
peak (README, "Reproducible models"); ``--train-dtype float64`` keeps every history equal. Each run is
``train_target(cfg, stop=STEPS)`` with the card's config: nothing is saved.

Usage: PYTHONPATH=services .venv/bin/python tools/target_repro_dtype.py [--steps 201]
       [--threads 1,2,4] [--dtypes float32,float64] [--json FILE]   (float64: ~3.5 min a run here)
"""
import argparse
import json
import subprocess
import sys

from gambit.train.target import TRAIN_DTYPES

CHILD = r"""
import json, sys
from gambit.train.target import TrainTargetConfig, train_target
dtype, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = train_target(TrainTargetConfig(threads=threads, train_dtype=dtype), stop=steps)
print(json.dumps([[h["step"], h["loss"]] for h in r["loss_history"]]))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=201, help="training steps per run (history every 100)")
    ap.add_argument("--threads", default="1,2,4", help="torch thread counts, comma list")
    ap.add_argument("--dtypes", default="float32,float64", help="training arithmetic, comma list")
    ap.add_argument("--json", default="", help="write the histories here")
    a = ap.parse_args()
    try:
        threads = [int(t) for t in a.threads.split(",") if t]
    except ValueError:
        ap.error(f"--threads takes a comma list of integers, got {a.threads!r}")
    dtypes = [d for d in a.dtypes.split(",") if d]
    if a.steps < 1 or not threads or min(threads) < 1 or not dtypes:
        ap.error("--steps >= 1, --threads positive integers, --dtypes not empty")
    if set(dtypes) - set(TRAIN_DTYPES):
        ap.error(f"--dtypes: unknown {sorted(set(dtypes) - set(TRAIN_DTYPES))}; known {list(TRAIN_DTYPES)}")
    runs = {}
    for d in dtypes:
        for t in threads:
            out = subprocess.run([sys.executable, "-c", CHILD, d, str(t), str(a.steps)], capture_output=True,
                                 text=True, check=True)
            runs[f"{d}/{t}"] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  {d}, {t} thread(s): {runs[f'{d}/{t}']}", file=sys.stderr, flush=True)
    steps = [s for s, _ in next(iter(runs.values()))]
    print("| arithmetic | threads | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|---:|" + "---:|" * len(steps))
    for key, hist in runs.items():
        d, t = key.split("/")
        print(f"| {d} | {t} | " + " | ".join(f"{v:.5f}" for _, v in hist) + " |")
    for d in dtypes:
        same = len({json.dumps(runs[f"{d}/{t}"]) for t in threads}) == 1
        print(f"{d}: the same history at every thread count: {same}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
