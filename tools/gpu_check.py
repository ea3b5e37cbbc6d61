"""The checks a session with a GPU runs first: the engine and speculative decoding on CUDA, in minutes.

On the device machine (its python3 holds a CUDA torch; nothing to install):
    PYTHONPATH=services python3 tools/gpu_check.py --json $OUT/gpu_check.json
Here, without a GPU, the same checks on the CPU's torch path (no C++ kernels), as on a GPU:
    PYTHONPATH=services .venv/bin/python tools/gpu_check.py --device cpu --quick

The shipped target and drafters travel with the working tree (no download). Per dtype (float32, and
bfloat16 on CUDA):
1. Plain greedy decoding on the device against the CPU's float32 reference (same prompts): outputs
   equal, and where not, the first differing position (float rounding differs between devices).
2. Lossless: EAGLE-3.1 and PR greedy outputs equal plain greedy on the same device, dtype and batch
   size (batch 1 and batch 8), at the paper's tree (B = 48, gamma 8, Bw = k = 6, m = 3) and the
   engine's. Plain batch 8 against plain batch 1 is reported beside it, not counted: a GPU's kernels
   may round differently by batch size, which is no speculative decoding defect.
3. Speed at batch 1: plain, EAGLE-3.1 and PR interleaved ``--reps`` times (a warm-up first), each
   prompt decoded to ``--speed-tokens`` (default ``--max-tokens``); speedup = plain seconds /
   speculative seconds within a repetition, median and spread; tau (from the lossless runs).
   ``--quick`` on the CPU times 8 tokens: a CPU's timings measure nothing, the part only has to run.
Prints a table, writes JSON (after each dtype's lossless checks too, so a time limit keeps what ran),
and exits 1 if any output was not lossless. Bad flags (``--per 0``, ``--device cuda`` without a GPU,
``--json`` naming a folder) are refused before any model loads; ``--quick`` sets only the flags not
given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from gambit.bench import args as bench_args
from gambit.bench.spec_cells import BASE, SPLITS, load_drafters, prompts_for, run_once
from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.model.loader import load_model
from gambit.paths import ASSETS, TARGET

TREES = {"paper (B=48)": BASE, "engine defaults": SpecConfig(max_batch=0)}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def positive(text: str) -> int:
    """argparse type: an int >= 1 (0 prompts, tokens or repetitions check nothing, or end in a crash)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def positives(text: str) -> list[int]:
    """argparse type: a comma-separated list of ints >= 1 (batch sizes)."""
    try:
        return [positive(x) for x in text.split(",")]
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"want comma-separated ints >= 1, got {text!r}") from None


def check_device(ap: argparse.ArgumentParser, value: str) -> str:
    """``value`` if it is cpu, cuda or a cuda:N this host has; else the usage and a one-line error."""
    if value == "auto":
        ap.error("--device: name cpu, cuda or cuda:N (the tools pick their dtypes by it)")
    try:
        return bench_args.device("--device", value)
    except ValueError as e:
        ap.error(str(e))


def check_out(ap: argparse.ArgumentParser, flag: str, value: str) -> str:
    """``value`` if a file can be written there ("" is no file): not a folder, in a writable folder."""
    if not value:
        return value
    path = Path(value)
    if path.is_dir():
        ap.error(f"{flag} {value}: a folder; name a file")
    if not path.parent.is_dir():
        ap.error(f"{flag} {value}: no folder {str(path.parent)!r}")
    try:  # os.access says yes to root on a read-only mount; a real file says what open() will
        with tempfile.TemporaryFile(dir=path.parent):
            pass
        if path.exists():
            with open(path, "a"):
                pass
    except OSError as e:
        ap.error(f"{flag} {value}: not writable ({e.strerror})")
    return value


def save(results: dict, json_path: str) -> None:
    """Write the results JSON so far (if asked); a part cut off by its time limit keeps what ran."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)


def finish(results: dict, json_path: str, ok: bool) -> None:
    """Write the results JSON (if asked) and exit 0 only if every check held (what gpu_run.sh reads)."""
    results["complete"] = True
    save(results, json_path)
    if json_path:
        print(f"wrote {json_path}")
    raise SystemExit(0 if ok else 1)


def check_dtype(device: str, dtype: str, prompts, ref: list, args, out: dict, saved) -> dict:
    """Fill ``out`` with one dtype's checks; ``saved()`` writes the JSON so far after the lossless part."""
    model, tok = load_model(str(TARGET), device=device, dtype=dtype)
    eng = Engine(model, tok, EngineConfig(device=device, dtype=dtype, spec=BASE, cpu_kernel=False))
    load_drafters(eng, ASSETS, keys=("eagle3.1", "pr"))  # the budget reserves two drafter caches
    out.update({"device": str(eng.device), "dtype": str(eng.dtype)})
    _, plain, _, _ = run_once(eng, prompts, 1, "plain", args.max_tokens)
    diffs = [first_difference(p, r) for p, r in zip(plain, ref, strict=True)]
    out["plain_equal_to_cpu_fp32"] = sum(d is None for d in diffs)
    out["plain_first_difference"] = [d for d in diffs if d is not None]
    _, plain8, _, _ = run_once(eng, prompts, 8, "plain", args.max_tokens)
    out["plain_batch8_equal_batch1"] = plain8 == plain
    reference = {1: plain, 8: plain8}  # lossless: equal to plain greedy at the same batch size
    lossless, tau = {}, {}
    for tree, spec in TREES.items():
        eng.config.spec = replace(spec, max_batch=0)
        for key in ("eagle3.1", "pr"):
            for batch in (1, 8):
                _, outs, cycles, accepted = run_once(eng, prompts, batch, key, args.max_tokens)
                lossless[f"{tree} / {key} / batch {batch}"] = outs == reference[batch]
                if batch == 1:
                    tau[f"{tree} / {key}"] = (accepted + cycles) / max(cycles, 1)
    out["lossless"], out["tau"] = lossless, tau
    print(f"\n{out['device']} {out['dtype']}: plain greedy equal to the CPU's float32 on "
          f"{out['plain_equal_to_cpu_fp32']}/{len(prompts)} prompts (first differences at "
          f"{out['plain_first_difference']}); plain batch 8 = batch 1 (not counted): "
          f"{out['plain_batch8_equal_batch1']}")
    print("lossless: " + ", ".join(f"{k} {v}" for k, v in lossless.items()), flush=True)
    saved()
    speed = {}
    for tree, spec in TREES.items():
        eng.config.spec = replace(spec, max_batch=0)
        keys = ("plain", "eagle3.1", "pr")
        for key in keys:  # warm-up: first calls, allocations, kernel selection
            run_once(eng, prompts[:1], 1, key, min(8, args.speed_tokens))
        secs: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(args.reps):
            for key in keys:
                secs[key].append(run_once(eng, prompts, 1, key, args.speed_tokens)[0])
        for key in keys[1:]:
            r = [p / s for p, s in zip(secs["plain"], secs[key], strict=True)]
            speed[f"{tree} / {key}"] = {"speedup": statistics.median(r), "spread": [min(r), max(r)],
                                        "seconds": secs[key], "plain_seconds": secs["plain"]}
    out["speed_batch1"] = speed
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags, checked (a bad one exits 2 with the usage, before any model loads)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device to check (default: cuda when present)")
    ap.add_argument("--dtypes", default="", help="comma-separated; default float32,bfloat16 on CUDA, "
                    "float32 on the CPU")
    ap.add_argument("--per", type=positive, help="test prompts per difficulty split (default 4)")
    ap.add_argument("--max-tokens", type=positive, help="tokens generated per prompt (default 96)")
    ap.add_argument("--reps", type=positive, help="interleaved timing repetitions (default 3)")
    ap.add_argument("--speed-tokens", type=positive, help="tokens per prompt in the speed part (default "
                    "--max-tokens)")
    ap.add_argument("--quick", action="store_true", help="1 prompt per split, 24 tokens, 1 repetition; "
                    "on the CPU the speed part times 8 tokens (for the flags not given)")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    check_device(ap, args.device)
    check_out(ap, "--json", args.json)
    for name, default, quick in (("per", 4, 1), ("max_tokens", 96, 24), ("reps", 3, 1)):
        if getattr(args, name) is None:  # an explicit flag wins over --quick, as in gambit bench serve
            setattr(args, name, quick if args.quick else default)
    if args.speed_tokens is None:  # a CPU's timings measure nothing: --quick only runs the part there
        cpu_quick = args.quick and args.device == "cpu"
        args.speed_tokens = min(8, args.max_tokens) if cpu_quick else args.max_tokens
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dtypes = args.dtypes.split(",") if args.dtypes else (
        ["float32", "bfloat16"] if args.device.startswith("cuda") else ["float32"])
    t0 = time.perf_counter()
    cpu_model, tok = load_model(str(TARGET), device="cpu", dtype="float32")
    prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
               for p in prompts_for(ops, args.per, 100 + i, tok)]
    # the reference on the CPU's torch path too: no C++ kernel to compile on the device machine
    cpu = Engine(cpu_model, tok, EngineConfig(device="cpu", dtype="float32", cpu_kernel=False))
    _, ref, _, _ = run_once(cpu, prompts, 1, "plain", args.max_tokens)
    print(f"CPU float32 reference: {len(prompts)} prompts, {args.max_tokens} tokens, "
          f"{time.perf_counter() - t0:.0f} s; checking {args.device} {','.join(dtypes)}", flush=True)
    results = {"torch": torch.__version__, "prompts": len(prompts), "max_tokens": args.max_tokens,
               "speed_tokens": args.speed_tokens,
               "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
               "complete": False, "checks": {}}
    ok = True
    for dtype in dtypes:
        r = results["checks"][dtype] = {}
        check_dtype(args.device, dtype, prompts, ref, args, r, lambda: save(results, args.json))
        save(results, args.json)
        ok &= all(r["lossless"].values())
        for k, v in r["speed_batch1"].items():
            print(f"  {k:28s} tau {r['tau'][k]:.2f}  speedup over plain {v['speedup']:.2f}x "
                  f"({v['spread'][0]:.2f}-{v['spread'][1]:.2f})")
    results["lossless"] = ok
    print(f"\nall lossless: {ok}; {time.perf_counter() - t0:.0f} s")
    finish(results, args.json, ok)


if __name__ == "__main__":
    main()
