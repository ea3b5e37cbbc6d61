"""Write this CPU vendor's reference histories next to shipped cards made on another vendor.

The reproducibility tests (tests/train/test_target_repro.py, test_drafter_repro.py,
tests/scoring/test_reproducible.py) retrain each shipped model's first steps and compare exactly with
the history of the CPU vendor they run on: the card's where it was made, else ``repro-<vendor>.json``
beside it (``gambit.train.vendor_history``: why the vendors differ). This writes those records with the
tests' own retraining: the target's first 200 steps, every drafter and ablation's first 200 (their data
regenerated once into a fresh cache), every scorer's probe. It prints, per model, where the rerun first
leaves the card. About 25 min on a 2-core Intel Xeon.

Usage: PYTHONPATH=services .venv/bin/python tools/record_vendor_history.py [--models target,drafter-pr,…]
       [--steps 200] [--json FILE]
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from gambit.cpu_info import cpu_model, cpu_vendor
from gambit.paths import ASSETS, TARGET
from gambit.train import vendor_history as vh
from gambit.train.repro import compare_history

DRAFTERS = ["drafter-pr", "drafter-eagle3.1", "drafter-hass", "drafter-hass-pr", "ablations/drafter-pr-beta0",
            "ablations/drafter-pr-noselfq", "ablations/drafter-eagle3.1-2layer"]
SCORERS = ["scorer-mlp", "scorer-sequence", "scorer-process"]
ALL = ["target", *DRAFTERS, *SCORERS]


def first_difference(card: list[dict], fresh: list[dict], upto: int) -> str:
    diff = compare_history(card, fresh, upto=upto)
    return diff[0] if diff else "none"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ALL),
                    help="comma-separated shipped models to record (names under services/gambit/assets)")
    ap.add_argument("--steps", type=int, default=200, help="training steps recorded per target / drafter")
    ap.add_argument("--json", default="", help="also write the summary table to this JSON file")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in ALL]
    if unknown or a.steps < 1:
        print(f"unknown models {unknown} (known: {', '.join(ALL)}) or --steps < 1", file=sys.stderr)
        return 2
    vendor = cpu_vendor()
    print(f"recording {len(models)} models on {vendor} ({cpu_model()})", file=sys.stderr)
    rows, cache = [], tempfile.mkdtemp(prefix="drafter-cache-")
    for name in models:
        folder = TARGET if name == "target" else ASSETS / name
        info = vh.card(folder)
        made_on = vh.card_vendor(info)
        if made_on == vendor:
            print(f"{name}: its card was made on {vendor}; nothing to record", file=sys.stderr)
            continue
        start = time.time()
        if name == "target":
            history = vh.rerun_target(tempfile.mkdtemp(), a.steps)["loss_history"]
            first = first_difference(info["loss_history"], history, a.steps)
            command = f"vendor_history.rerun_target(steps={a.steps})"
        elif name in DRAFTERS:
            history = vh.rerun_drafter(name, a.steps, cache)["loss_history"]
            first = first_difference(info["loss_history"], history, a.steps - 1)
            command = f"vendor_history.rerun_drafter({name!r}, steps={a.steps})"
        else:
            history = vh.rerun_probe(folder)
            card_epochs = info["repro"]["loss_history"]
            first = next((f"epoch {h['epoch']}" for c, h in zip(card_epochs, history, strict=True) if c != h),
                         "none")
            command = "vendor_history.rerun_probe()"
        path = vh.write_record(folder, history, command, made_on)
        rows.append({"model": name, "card_vendor": made_on, "entries": len(history),
                     "first_difference": first,
                     "seconds": round(time.time() - start, 1), "record": str(path.relative_to(ASSETS))})
        print(f"{name}: {rows[-1]['first_difference']} ({rows[-1]['seconds']} s)", file=sys.stderr)
    print("| model | card made on | entries | first difference from the card | s |")
    print("|---|---|---:|---|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['card_vendor']} | {r['entries']} | {r['first_difference']} "
              f"| {r['seconds']} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"vendor": vendor, "cpu": cpu_model(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
