"""Another commit against this checkout, whole engine (Python and C++), in alternating processes.

``tools/kernel_ab.py`` swaps only the C++ kernels inside one process; a change to the engine's Python
(sampling, metadata, events) needs each side's own code. This tool checks REV out into a temporary
git worktree and runs one measurement at a time, alternating sides (old, new, new, old, ...), each in a
fresh process with that side's ``services`` on its path (its kernels built from its own sources, cached
by digest). Measurements, each a median over ``--reps`` pairs:

* ``plain B``: plain decoding of the shipped target (or ``--model``, with ``--weights`` / ``--kv``), B
  traces of ``--tokens`` tokens at T = ``--temperature`` (0.8) with the chosen token's log-probability and
  the largest (``--logprobs``: 1, what a Gambit search asks for; DeepConf asks 20), optionally with a
  nucleus (``--top-p``), seconds per run;
* ``search``: one search chunk (6 hard test problems, C = 16, Gambit, the search bench's KV sizing).

Each side's outputs are hashed: ``same`` says both generated the same tokens (and answers).

With ``--old-env`` / ``--new-env KEY=VALUE`` one side's processes get extra environment variables: REV
HEAD then compares an environment against none (an allocator through ``LD_PRELOAD``, a thread setting).

Usage: .venv/bin/python tools/checkout_ab.py REV [--batches 1,16,96] [--tokens 200] [--reps 5]
       [--model smollm2 [--weights bfloat16] [--kv bfloat16]] [--temperature T] [--batch-invariant]
       [--no-search] [--json FILE]
       [--old-env K=V ...] [--new-env K=V ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# run inside each side's process: prints one JSON line {"seconds": [...], "digest": ...}
CHILD = r"""
import hashlib, json, sys, time, torch
torch.set_num_threads(2)
kind, model_name = sys.argv[1], sys.argv[2]
batch, tokens, reps = (int(x) for x in sys.argv[3:6])
weights, kv, logprobs, top_p = sys.argv[6], sys.argv[7], int(sys.argv[8]), float(sys.argv[9])
temperature, invariant = float(sys.argv[10]), sys.argv[11] == "1"
from gambit.model.loader import load_model
from gambit.model.registry import resolve_model
from gambit.paths import TARGET
model, tok = load_model(str(resolve_model(model_name or str(TARGET))), device="cpu", dtype="float32")
h, secs = hashlib.sha256(), []
if kind == "plain":
    from gambit.engine import Engine, EngineConfig, FinishedEvent, SamplingParams
    eng = Engine(model, tok, EngineConfig(cpu_weights=weights, kv_dtype=kv, batch_invariant=invariant))
    ids = tok.encode("Q: 3 + 4 * 5 - 2 = ?\n\n")
    for r in range(reps + 1):  # the first warms up
        tids = [eng.add(ids, SamplingParams(temperature=temperature, max_tokens=tokens, seed=i,
                                            ignore_eos=True, logprobs=logprobs, top_p=top_p))
                for i in range(batch)]
        outs, t = {}, time.perf_counter()
        while eng.has_unfinished():
            for ev in eng.step():
                if isinstance(ev, FinishedEvent):
                    outs[ev.trace_id] = ev.output_ids
        if r:
            secs.append(time.perf_counter() - t)
            h.update(repr([outs[i] for i in tids]).encode())
else:
    from gambit.bench.search import DIFFICULTIES, BenchSearchConfig, chunk_engine
    from gambit.search.driver import SearchDriver
    try:
        from gambit.scoring.spec import load_scorer_spec
    except ImportError:  # a checkout from before the scorer spec had one loader
        from gambit.search.scorers import load_default_scorer as load_scorer_spec
    from gambit.search.store import MemoryStore
    from gambit.tasks.arithmetic import TaskConfig, generate
    scorer = load_scorer_spec("process", model.config.hidden_size)
    problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
    bcfg = BenchSearchConfig(capacity=16, concurrency=len(problems))
    for r in range(reps + 1):
        engine, _ = chunk_engine(model, tok, problems, bcfg)
        driver = SearchDriver(engine, scorer, MemoryStore())
        t = time.perf_counter()
        res = driver.run_until_done([driver.submit(p, bcfg.search()) for p in problems])
        if r:
            secs.append(time.perf_counter() - t)
            h.update(repr(sorted((v.answer, v.tokens) for v in res.values())).encode())
print(json.dumps({"seconds": secs, "digest": h.hexdigest()}))
"""


def run_side(tree: Path, kind: str, model: str, batch: int, tokens: int, reps: int,
             extra: dict[str, str], weights: str = "float32", kv: str = "auto", logprobs: int = 1,
             top_p: float = 1.0, temperature: float = 0.8, invariant: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "services"), **extra)
    out = subprocess.run([sys.executable, "-c", CHILD, kind, model, str(batch), str(tokens), str(reps),
                          weights, kv, str(logprobs), str(top_p), str(temperature), str(int(invariant))],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev", help="the commit to compare against (a git revision of this repository)")
    ap.add_argument("--batches", default="1,16,96", help="plain decoding batch sizes (traces), comma list")
    ap.add_argument("--tokens", type=int, default=200, help="tokens each trace generates in a plain run")
    ap.add_argument("--reps", type=int, default=5, help="alternating pairs of processes per measurement")
    ap.add_argument("--inner", type=int, default=2, help="timed runs inside each process (their median)")
    ap.add_argument("--model", default="", help="model for plain decoding (default the shipped target)")
    ap.add_argument("--weights", default="float32", choices=("float32", "bfloat16"),
                    help="plain decoding's CPU linear weights (EngineConfig.cpu_weights)")
    ap.add_argument("--kv", default="auto", choices=("auto", "float32", "bfloat16"),
                    help="plain decoding's KV cache elements (EngineConfig.kv_dtype)")
    ap.add_argument("--logprobs", type=int, default=1,
                    help="plain decoding's log-probabilities a token: the chosen one's and the N largest "
                         "(1: what a Gambit search asks; DeepConf asks 20)")
    ap.add_argument("--top-p", type=float, default=1.0,
                    help="plain decoding's nucleus mass, 0 < p <= 1 (1: no filter, what the searches use)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="plain decoding's sampling temperature (> 0; a low one makes cold rows)")
    ap.add_argument("--batch-invariant", action="store_true",
                    help="plain decoding with EngineConfig.batch_invariant (both sides need it: stop 52 on)")
    ap.add_argument("--no-search", action="store_true", help="skip the search chunk")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--old-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for the old side's processes (repeatable)")
    ap.add_argument("--new-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for this checkout's processes (repeatable)")
    args = ap.parse_args()
    envs = {}
    for side, pairs in (("old", args.old_env), ("new", args.new_env)):
        bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0]]
        if bad:
            ap.error(f"--{side}-env takes KEY=VALUE, got {bad}")
        envs[side] = dict(p.split("=", 1) for p in pairs)
    if args.reps < 1 or args.tokens < 1 or args.inner < 1 or args.logprobs < 0 or not 0 < args.top_p <= 1 \
            or not args.temperature > 0:
        ap.error("--reps, --tokens and --inner must be >= 1, --logprobs >= 0, 0 < --top-p <= 1, "
                 "--temperature > 0")
    batches = [int(b) for b in args.batches.split(",") if b]
    tasks = [("plain", b) for b in batches] + ([] if args.no_search else [("search", 0)])
    rows = []
    with tempfile.TemporaryDirectory(prefix="gambit-ab-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.rev],
                       check=True, capture_output=True)
        try:
            for kind, b in tasks:
                sides: dict[str, list[float]] = {"old": [], "new": []}
                digests: dict[str, set[str]] = {"old": set(), "new": set()}
                for r in range(args.reps):
                    for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                        res = run_side(old if side == "old" else ROOT, kind, args.model, b, args.tokens,
                                       args.inner, envs[side], args.weights, args.kv, args.logprobs,
                                       args.top_p, args.temperature, args.batch_invariant)
                        sides[side].append(statistics.median(res["seconds"]))
                        digests[side].add(res["digest"])
                    print(f"  {kind} {b or ''}: pair {r + 1}/{args.reps}", file=sys.stderr, flush=True)
                ratios = [n / o for o, n in zip(sides["old"], sides["new"], strict=True)]
                rows.append({"measure": kind if kind == "search" else f"plain {b}",
                             "old_s": statistics.median(sides["old"]),
                             "new_s": statistics.median(sides["new"]),
                             "ratio": statistics.median(ratios), "ratio_min": min(ratios),
                             "ratio_max": max(ratios), "same": digests["old"] == digests["new"]
                             and len(digests["new"]) == 1})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)],
                           capture_output=True)
    print(f"\n{args.rev} (old) vs this checkout (new), {args.reps} alternating pairs"
          f"{', model ' + args.model if args.model else ''}, weights {args.weights}, KV {args.kv}, "
          f"logprobs={args.logprobs}, top-p {args.top_p}, T {args.temperature}"
          + (", batch-invariant" if args.batch_invariant else "")
          + "".join(f"; {side} env {e}" for side, e in envs.items() if e))
    print("| measure | old s | new s | new / old | spread | same output |\n|---|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['measure']} | {r['old_s']:.4f} | {r['new_s']:.4f} | {r['ratio']:.3f} | "
              f"{r['ratio_min']:.3f}-{r['ratio_max']:.3f} | {r['same']} |")
    if args.json:
        info = {"rev": args.rev, "model": args.model or "target", "weights": args.weights, "kv": args.kv,
                "logprobs": args.logprobs, "top_p": args.top_p, "temperature": args.temperature, "env": envs,
                "batch_invariant": args.batch_invariant,
                "rows": rows}
        Path(args.json).write_text(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
