"""Speculative decoding on another commit's CPU kernels and attention routing against this checkout's,
in one process, interleaved (old, new, new, old, ...): each side decodes the prompts plainly and with
PR and EAGLE-3.1 at every named tree; reported per side: the speedup over its own plain decoding
(median and spread over the repetitions), the seconds per cycle, the verification forward's median
time (the C++ layer loop on a tree's rows) and whether every output equals plain decoding's; per batch,
each side's plain decoding time and whether both sides decoded the same tokens; with ``--search-pairs N``
also a search chunk's wall time per side (N interleaved pairs) and whether the answers agree; with
``--plain-model NAME`` plain greedy decoding of another model (a real checkpoint) at each batch size
(``--plain-temperature T``: seeded sampling at T instead; both sides must draw the same tokens).

The other commit's C++ kernel sources (every module whose ``SOURCE`` the extension compiles) are built
as their own extension and swapped in for its side's runs, with that commit's
``attention.kernel_serves``; everything else is this checkout's code.

Usage: PYTHONPATH=services .venv/bin/python tools/kernel_ab.py REV [--batches 1,4] [--trees "B=48;defaults"]
       [--reps N] [--search-pairs N] [--plain-model smollm2 [--plain-weights bfloat16] [--plain-kv bfloat16]
       [--plain-tokens N] [--plain-temperature T] [--plain-only]] [--json FILE]
"""
import argparse
import collections
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import types

import torch
from torch.utils.cpp_extension import load_inline

import gambit.engine.attention as attention
from gambit.bench.spec_cells import BASE, load_drafters, prompts_for, run_once, spec_from_name
from gambit.engine import Engine, EngineConfig, cpu_attention, cpu_sample_step
from gambit.paths import ASSETS, TARGET

# the extension's sources in cpu_attention.kernel()'s order, and the functions it may export
SOURCES = [(f"services/gambit/{path}.py", name) for path, name in (
    ("engine/cpu_attention", "_SOURCE"), ("engine/cpu_gemv", "SOURCE"), ("engine/cpu_invariant", "SOURCE"),
    ("engine/cpu_decoder", "SOURCE"),
    ("speculative/cpu_drafter", "SOURCE"), ("speculative/cpu_tree", "SOURCE"),
    ("engine/cpu_rank", "SOURCE"), ("engine/cpu_filter", "SOURCE"), ("engine/cpu_sampler", "SOURCE"),
    ("engine/cpu_logprobs", "SOURCE"), ("engine/cpu_sample_step", "SOURCE"), ("engine/kv_cache", "SOURCE"),
    ("speculative/tap_store", "SOURCE"))]
FUNCTIONS = ["paged_decode", "paged_attention", "dense_attention", "rms_norm", "gemv_t", "invariant_linear",
             "decoder_layers",
             "drafter_forward", "tree_draft", "sample_tokens", "kv_copy_slots", "fused_silu_exact",
             "aten_rms_norm", "aten_rms_norm_exact", "sample_step", "fused_sampler_exact", "rows_to_slots"]


def module_at(rev: str, path: str) -> types.ModuleType:
    src = subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
    mod = types.ModuleType(f"{rev}:{path}")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, path, "exec"), mod.__dict__)
    return mod


def _source_at(rev: str, path: str, name: str) -> str:
    """A module's C++ source string at ``rev``, read without importing it (its imports are this tree's);
    empty where the module did not exist yet."""
    try:
        text = subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True, stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        return ""
    return re.search(name + r' = r"""(.*?)"""', text, re.S).group(1)


class Timed:
    """A kernel module whose ``decoder_layers`` calls on ``rows`` new tokens are timed (rows None: none
    are; the wrapper then only passes an older build the arguments it takes)."""

    def __init__(self, mod, rows: int | None, out: list[float]) -> None:
        self.mod, self.rows, self.out = mod, rows, out

    def __getattr__(self, name):
        fn = getattr(self.mod, name)
        if name != "decoder_layers":
            return fn

        def timed(*a):
            takes = len(re.findall(r"\barg\d+:", fn.__doc__.split("\n")[0]))
            if takes == len(a) - 1 and a[-1] is False:  # a build before stop 52: no batch_invariant flag
                a = a[:-1]
            t = time.perf_counter()
            r = fn(*a)
            if self.rows is not None and a[0].shape[1] == self.rows:
                self.out.append(time.perf_counter() - t)
            return r
        return timed


ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("rev", help="the other commit (e.g. HEAD~1)")
ap.add_argument("--batches", default="1", help="batch sizes, comma-separated")
ap.add_argument("--trees", default="B=48;defaults",
                help="tree names (bench.spec_cells.spec_from_name), ';'-separated")
ap.add_argument("--reps", type=int, default=6, help="repetitions (each: both sides, the order alternating)")
ap.add_argument("--search-pairs", type=int, default=0,
                help="also time this many old/new pairs of one search chunk (6 Gambit runs of C = 16 at "
                     "once, the search bench's sizing: 96-trace steps)")
ap.add_argument("--plain-model", default="",
                help="also A/B plain greedy decoding of this model (a folder or registered name, e.g. "
                     "smollm2) at each --batches size, --plain-tokens a trace (EOS ignored), --reps pairs")
ap.add_argument("--plain-tokens", type=int, default=32,
                help="--plain-model's new tokens a trace (the context grows to ~20 + this)")
ap.add_argument("--plain-weights", default="float32", choices=("float32", "bfloat16"),
                help="--plain-model's CPU linear weights (EngineConfig.cpu_weights)")
ap.add_argument("--plain-kv", default="auto", choices=("auto", "float32", "bfloat16"),
                help="--plain-model's KV cache elements (EngineConfig.kv_dtype; REV must read bf16 blocks)")
ap.add_argument("--plain-temperature", type=float, default=0.0,
                help="--plain-model's sampling temperature (0: greedy; else seeded, one seed a trace)")
ap.add_argument("--plain-only", action="store_true",
                help="skip the shipped target's speculative A/B (only --plain-model and --search-pairs)")
ap.add_argument("--json", default=None, help="write the rows here")
args = ap.parse_args()
torch.set_num_threads(os.cpu_count() or 1)
sources = [_source_at(args.rev, path, name) for path, name in SOURCES]
digest = hashlib.sha256("".join(sources).encode()).hexdigest()[:12]
exported = [f for f in FUNCTIONS if re.search(rf"\b{f}\(", "".join(sources))]
old = load_inline(name=f"gambit_cpu_kernels_{digest}", cpp_sources=sources, functions=exported,
                  extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"])
kernels = {"old": Timed(old, None, []), "new": cpu_attention.kernel()}
serves = {"old": module_at(args.rev, "services/gambit/engine/attention.py").kernel_serves,
          "new": attention.kernel_serves}


def use(side: str, *engines: Engine) -> None:
    """Swap in a side's kernels and attention routing. An engine binds its sampling step (``sample_step``)
    and its KV cache's slot copies when it is made, so each engine named gets the side's again (before
    6012d1d both sides ran this checkout's for these two)."""
    attention.kernel_serves = serves[side]
    cpu_attention._module = kernels[side]
    for e in engines:
        if e._step_draw is not None:
            e._step_draw = cpu_sample_step.step_kernel(e.device, e.model.config.vocab_size)
        if e.runner.cache.kernel is not None:
            e.runner.cache.kernel = cpu_attention.kernel()


eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
load_drafters(eng, ASSETS)
trees = args.trees.split(";")
rows_out = []
for b in [] if args.plain_only else [int(x) for x in args.batches.split(",")]:
    prompts = prompts_for((2, 8), max(8, b), 11, eng.tokenizer)
    res = collections.defaultdict(list)
    fwd = collections.defaultdict(list)
    for r in range(args.reps):
        for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
            use(side, eng)
            eng.config.spec = BASE
            plain_s, plain_out, _, _ = run_once(eng, prompts, b, "plain", 96)
            res[(side, "plain")].append(plain_s)
            res[(side, "plain_out")] = plain_out
            for tree in trees:
                spec = spec_from_name(tree)
                eng.config.spec = spec
                cpu_attention._module = Timed(kernels[side], b * (spec.budget + 1), fwd[(side, tree)])
                for method in ("pr", "eagle3.1"):
                    s, out, cycles, _ = run_once(eng, prompts, b, method, 96)
                    res[(side, tree, method)].append((s, cycles, out == plain_out))
                cpu_attention._module = kernels[side]
    use("new", eng)
    po, pn = (statistics.median(res[(side, "plain")]) for side in ("old", "new"))
    same = res[("old", "plain_out")] == res[("new", "plain_out")]
    print(f"batch {b:3d} plain decoding: old {po:.3f} s, new {pn:.3f} s (new / old {pn / po:.3f}); "
          f"the same tokens: {same}", flush=True)
    rows_out.append({"batch": b, "plain_s": {"old": po, "new": pn}, "same_plain_tokens": same})
    for tree in trees:
        for method in ("pr", "eagle3.1"):
            row = {"batch": b, "tree": tree, "method": method}
            line = f"batch {b:3d} {method:9s} [{tree}]"
            for side in ("old", "new"):
                runs, plain = res[(side, tree, method)], res[(side, "plain")]
                sp = [p / x[0] for p, x in zip(plain, runs, strict=True)]
                cyc = statistics.median(x[0] / x[1] for x in runs) * 1e3 if runs[0][1] else 0.0
                f = statistics.median(fwd[(side, tree)]) * 1e3 if fwd[(side, tree)] else 0.0
                row[side] = {"speedup": statistics.median(sp), "spread": [min(sp), max(sp)], "cycle_ms": cyc,
                             "verify_forward_ms": f, "lossless": all(x[2] for x in runs)}
                line += (f"  {side}: {row[side]['speedup']:.2f}x ({min(sp):.2f}-{max(sp):.2f}) cycle "
                         f"{cyc:.2f} ms verify fwd {f:.2f} ms lossless {row[side]['lossless']}")
            print(line, flush=True)
            rows_out.append(row)
if args.search_pairs:
    from gambit.bench.search import DIFFICULTIES, BenchSearchConfig, chunk_engine
    from gambit.scoring.spec import load_scorer_spec
    from gambit.search.driver import SearchDriver
    from gambit.search.store import MemoryStore
    from gambit.tasks.arithmetic import TaskConfig, generate

    problems = generate("test", 6, 1, TaskConfig(*DIFFICULTIES["hard"]))
    bcfg = BenchSearchConfig(capacity=16, concurrency=6)
    scorer = load_scorer_spec("process", eng.model.config.hidden_size)
    walls, answers = collections.defaultdict(list), {}
    for r in range(args.search_pairs):
        for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
            use(side)  # the chunk's engine is made below, on this side's kernels
            chunk, _ = chunk_engine(eng.model, eng.tokenizer, problems, bcfg)
            driver = SearchDriver(chunk, scorer, MemoryStore())
            ids = [driver.submit(p, bcfg.search()) for p in problems]
            t0 = time.perf_counter()
            done = driver.run_until_done(ids)
            walls[side].append(time.perf_counter() - t0)
            answers.setdefault(side, [done[i].answer for i in ids])
    use("new")
    ratios = [n / o for o, n in zip(walls["old"], walls["new"], strict=True)]
    row = {"search_chunk_s": {k: statistics.median(v) for k, v in walls.items()},
           "new_over_old": statistics.median(ratios), "spread": [min(ratios), max(ratios)],
           "same_answers": answers["old"] == answers["new"]}
    sec = row["search_chunk_s"]
    print(f"search chunk: old {sec['old']:.3f} s, new {sec['new']:.3f} s; new / old per pair "
          f"{row['new_over_old']:.3f} ({min(ratios):.3f}-{max(ratios):.3f}); the same answers: "
          f"{row['same_answers']}", flush=True)
    rows_out.append(row)
if args.plain_model:
    from gambit.engine import SamplingParams

    plain_cfg = EngineConfig(model=args.plain_model, cpu_weights=args.plain_weights, kv_dtype=args.plain_kv)
    other = Engine.from_pretrained(args.plain_model, plain_cfg)
    asks = [other.tokenizer.encode(f"Question {i}: what is {7 * i} plus {13 * i}? Think step by step.")
            for i in range(64)]
    for b in [int(x) for x in args.batches.split(",")]:
        secs, outs = collections.defaultdict(list), {}
        for r in range(args.reps):
            for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                use(side, other)
                t0 = time.perf_counter()
                params = [SamplingParams(temperature=args.plain_temperature, max_tokens=args.plain_tokens,
                                         ignore_eos=True, seed=i) for i in range(b)]
                outs[side] = other.generate(asks[:b], params)
                secs[side].append(time.perf_counter() - t0)
        use("new", other)
        ratios = [n / o for o, n in zip(secs["old"], secs["new"], strict=True)]
        row = {"model": args.plain_model, "weights": args.plain_weights, "kv": args.plain_kv,
               "tokens": args.plain_tokens, "temperature": args.plain_temperature,
               "batch": b, "new_over_old": statistics.median(ratios),
               "plain_s": {k: statistics.median(v) for k, v in secs.items()},
               "same_tokens": outs["old"] == outs["new"]}
        print(f"{args.plain_model} batch {b:3d} plain decoding: old {row['plain_s']['old']:.3f} s, new "
              f"{row['plain_s']['new']:.3f} s; new / old per pair {row['new_over_old']:.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}); the same tokens: {row['same_tokens']}", flush=True)
        rows_out.append(row)
if args.json:
    with open(args.json, "w") as fh:
        json.dump({"rev": args.rev, "reps": args.reps, "rows": rows_out}, fh, indent=1)
