"""The shipped target's first training steps under each arithmetic and thread count, each in its own
process: does the loss history (the card's 5 digits) depend on the thread count?

``gambit train target`` in float32 (the shipped card's) parts by thread count past the learning-rate
peak (README, "Reproducible models"); ``--train-dtype float64`` keeps every history equal. Each run is
``train_target(cfg, stop=STEPS)`` with the card's config: nothing is saved.

Usage: PYTHONPATH=services .venv/bin/python tools/target_repro_dtype.py [--steps 201]
       [--threads 1,2,4] [--dtypes float32,float64] [--isa avx2] [--json FILE]   (float64: ~3.5 min a run)
       PYTHONPATH=services .venv/bin/python tools/target_repro_dtype.py --time-switches [--steps 41]
       [--reps 3] [--threads 2]   (what each compatible-mode switch costs, fresh processes, interleaved)

``--isa avx2`` pins the instruction set the children's arithmetic may use (ATen's kernels through
``ATEN_CPU_CAPABILITY``, MKL's through its conditional-numerical-reproducibility mode ``MKL_CBWR``,
oneDNN's through ``ONEDNN_MAX_CPU_ISA``): histories then depend on the machine only through what these
libraries promise to keep fixed. Stop 38 found the histories differ by instruction set (this AVX2 host
against stop 37's AVX-512 one), in float64 too.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

from gambit.train import repro
from gambit.train.target import TRAIN_DTYPES

# per --isa: the libraries' own switches. MKL's CNR branches other than COMPATIBLE promise equal results
# only on Intel CPUs (elsewhere MKL falls back to its AUTO branch); COMPATIBLE holds on every x86 CPU.
ISA_ENV = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
           "compatible": repro.ISA_ENV["compatible"]}  # what `gambit train target --isa compatible` sets

CHILD = r"""
import json, sys, time
from gambit.train.target import TrainTargetConfig, train_target
dtype, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
r = train_target(TrainTargetConfig(threads=threads, train_dtype=dtype), stop=steps)
seconds = time.perf_counter() - t0
print(json.dumps({"history": [[h["step"], h["loss"]] for h in r["loss_history"]], "seconds": seconds}))
"""

# --time-switches: the compatible mode's switches one at a time, then together (the machine's own first)
SWITCH_SETS = {"machine": {}, **{f"{k} alone": {k: v} for k, v in repro.LIBRARY_SWITCHES.items()},
               "all three": dict(repro.LIBRARY_SWITCHES)}


def run_child(dtype: str, threads: int, steps: int, env_extra: dict) -> dict:
    """One training run in a fresh process (the switches are read when torch loads)."""
    env = dict(os.environ)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", CHILD, dtype, str(threads), str(steps)], capture_output=True,
                         text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_switches(steps: int, threads: int, reps: int, dtype: str) -> dict:
    """Training seconds per switch set, interleaved (A B C ... A B C ...) so drift hits every set alike;
    the time counts ``train_target`` only, not the process start or torch's import."""
    secs: dict[str, list[float]] = {k: [] for k in SWITCH_SETS}
    for r in range(reps):
        for name, env_extra in SWITCH_SETS.items():
            secs[name].append(run_child(dtype, threads, steps, env_extra)["seconds"])
            print(f"  rep {r + 1}/{reps} {name}: {secs[name][-1]:.1f} s", file=sys.stderr, flush=True)
    base = statistics.median(secs["machine"])
    print(f"| switches ({steps} steps, {threads} threads, {dtype}) | median s | min-max s | × machine |")
    print("|---|---:|---:|---:|")
    for name, v in secs.items():
        med = statistics.median(v)
        print(f"| {name} | {med:.1f} | {min(v):.1f}-{max(v):.1f} | {med / base:.2f} |")
    return secs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=201, help="training steps per run (history every 100)")
    ap.add_argument("--threads", default="1,2,4", help="torch thread counts, comma list")
    ap.add_argument("--dtypes", default="float32,float64", help="training arithmetic, comma list")
    ap.add_argument("--isa", default="", choices=["", *ISA_ENV], help="pin the children's instruction set "
                    "(ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA): avx2, or compatible (scalar ATen, "
                    "MKL's branch for every x86 CPU); empty: the machine's own")
    ap.add_argument("--json", default="", help="write the histories (with --time-switches: "
                    "the seconds) here")
    ap.add_argument("--time-switches", action="store_true", help="instead of histories: time the training "
                    "under each compatible-mode switch alone and all three, against the machine's kernels "
                    "(first dtype and thread count; --steps 41 is enough)")
    ap.add_argument("--reps", type=int, default=3, help="with --time-switches: runs per switch "
                    "set, interleaved")
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
    if a.time_switches:
        if a.reps < 1 or a.isa:
            ap.error("--time-switches: --reps >= 1, and no --isa (it times every switch set itself)")
        secs = time_switches(a.steps, threads[0], a.reps, dtypes[0])
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"steps": a.steps, "threads": threads[0], "dtype": dtypes[0], "seconds": secs,
                           "machine": _machine()}, f, indent=1)
        return 0
    runs = {}
    for d in dtypes:
        for t in threads:
            runs[f"{d}/{t}"] = run_child(d, t, a.steps, ISA_ENV.get(a.isa, {}))["history"]
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
            json.dump({"steps": a.steps, "runs": runs, "isa": a.isa or "machine", "machine": _machine()}, f,
                      indent=1)
    return 0


def _machine() -> dict:
    """What the histories may depend on: CPU model and flags' vector width, torch's dispatch level."""
    import torch

    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        lines = info.splitlines()
        flags = next((ln for ln in lines if ln.startswith("flags")), "")
        model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    except OSError:
        model = platform.processor()
    return {"cpu": model, "avx512f": " avx512f" in flags, "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


if __name__ == "__main__":
    sys.exit(main())
