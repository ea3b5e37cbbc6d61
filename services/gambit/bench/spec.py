"""``gambit bench spec``: EAGLE-3.1 vs Parallel Reconsideration on the shipped target, side by side.

The paper's tables in miniature (temperature 0, test problems split by difficulty): τ (tokens per
target forward: (accepted + cycles) / cycles) and wall-clock speedup over plain decoding. Every
measured cell is a group of systems run interleaved (A B C A B C ...) for ``reps`` repetitions on one
engine; a speedup is plain time / system time within each repetition, reported as the median with
the min-max spread. Every greedy output is compared with plain decoding (``lossless``).
Drafters come from ``assets/drafter-*``; a missing one is replaced by a random-initialised drafter
(τ ≈ 1, labelled ``random``, with a note) so the command always runs; a ``--drafters`` folder that is
not there, or that holds none of the drafters, is refused (``--allow-random-drafters``: run on
stand-ins alone, a smoke test).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.bench import args as bench_args
from gambit.bench.kernel_note import cpu_kernels_note
from gambit.bench.spec_cells import (
    BASE,
    DEFAULTS,
    DRAFTERS,
    OPTIONAL,
    SPLITS,
    _pool_analysis,
    drafters_in,
    load_drafters,
    measure,
    prompts_for,
)
from gambit.bench.spec_report import CAPPED, TABLES, _cycle_ratio, finished_cells, format_tables, plots
from gambit.checks import at_least
from gambit.engine import Engine, EngineConfig
from gambit.engine.config import SpecConfig
from gambit.paths import ASSETS, TARGET


def run_bench(quick: bool, reps: int, max_tokens: int, threads: int, folder: Path = ASSETS,
              device: str = "auto", target: Path = TARGET, out: dict | None = None) -> dict:
    """Every table; ``out``: the dict the cells are written into as each finishes (the caller's, so a
    Ctrl-C keeps them), returned."""
    threads = threads or os.cpu_count() or 1  # 0: every core, as the serving engine runs (Target)
    torch.set_num_threads(threads)
    # every drafter below gets a KV cache: the budget (on CUDA ~all free memory) reserves room for each
    spec = SpecConfig(max_drafters=len(DRAFTERS))
    eng = Engine.from_pretrained(str(target), EngineConfig(model=str(target), device=device, spec=spec))
    tok = eng.tokenizer
    found = load_drafters(eng, folder)
    for key in (k for k, v in found.items() if v == "random"):  # said where it is run, not only in the JSON
        print(f"note: no {DRAFTERS[key][0]} in {folder}: a random stand-in drafter (tau ~ 1) for {key}",
              file=sys.stderr)
    per_split = 2 if quick else 4
    splits = {name: prompts_for(rng, per_split, 100 + i, tok)
              for i, (name, rng) in enumerate(SPLITS.items())}
    mixed = [p for ps in splits.values() for p in ps]
    many = prompts_for((2, 8), 8 if quick else 16, 7, tok)
    batches = [1, 4] if quick else [1, 2, 4, 8, 16]
    budgets = [8, 24, 48] if quick else [8, 16, 24, 32, 48, 64]  # small B: where a CPU gains
    widths = [4, 8]
    E, P = "eagle3.1", "pr"
    both = lambda spec, tag="": {f"{E}{tag}": (E, spec), f"{P}{tag}": (P, spec)}  # noqa: E731
    plan = []  # (table, name, prompts, batch, systems)
    plan.append(("headline", "B=48 batch 1", mixed, 1, both(BASE)))
    plan.append(("defaults", "engine defaults batch 1", mixed, 1, both(DEFAULTS)))
    for name, ps in splits.items():
        plan.append(("table1", name, ps, 1, {**both(replace(BASE, budget=24), "@24"), **both(BASE, "@48")}))
    for b in batches:
        plan.append(("table2", f"batch {b}", many[:max(b, 8 if quick else 16)], b, both(BASE)))
    t3 = {P: (P, BASE), "pr, no self-query at serving": (P, replace(BASE, self_query=False)), E: (E, BASE)}
    for key, label in (("pr-beta0", "pr, beta = 0 (retrained)"),
                       ("pr-noselfq", "pr, no self-query (retrained)"),
                       ("eagle3.1-2layer", "eagle3.1, second layer")):
        if key in found:  # the no-self-query drafter was trained without it: serve it the same way
            t3[label] = (key, replace(BASE, self_query=False) if key == "pr-noselfq" else BASE)
    plan.append(("table3", "ablations", mixed, 1, t3))
    plan.append(("table4", "extra rows", mixed, 1, {
        "eagle3.1 (Bw=6)": (E, BASE), "eagle3.1 + advance 3": (E, replace(BASE, extra="advance")),
        "eagle3.1 widen Bw=9": (E, replace(BASE, grow_width=9)), "pr m=0": (P, replace(BASE, reconsider=0)),
        "pr m=3": (P, BASE), "pr m=3, merge (not fresh)": (P, replace(BASE, fresh=False))}))
    for B in budgets:
        if B != 48:
            plan.append(("table5", f"B={B}", mixed, 1, both(replace(BASE, budget=B))))
    for w in widths:
        plan.append(("table5", f"Bw={w}", mixed, 1, both(replace(BASE, grow_width=w))))
        plan.append(("table5", f"k={w}", mixed, 1, both(replace(BASE, offer_width=w))))
    plan.append(("table6", "hass", mixed, 1, {"hass": ("hass", BASE), "hass+pr": ("hass+pr", BASE)}))
    cap_batches = [1, 4, 8, 16] if quick else [1, 2, 4, 8, 16, 32]
    pool = prompts_for((2, 8), max(cap_batches), 11, tok)
    for b in cap_batches:
        plan.append(("batch_cap", f"batch {b}", pool[:b], b, {
            "pr, no cap": (P, DEFAULTS), CAPPED: (P, SpecConfig())}))
    total = sum(reps * (1 + len(s)) for *_, s in plan)
    ref: dict = {}
    out = {} if out is None else out
    out.update({"target": str(target), "drafters": found, "reps": reps, "max_tokens": max_tokens,
                "threads": threads, "quick": quick, "spec": BASE.__dict__,
                "spec_defaults": SpecConfig().__dict__})
    with tqdm(total=total, desc="bench spec", unit="run") as bar:
        for table, name, ps, b, systems in plan:
            out.setdefault(table, {})[name] = measure(eng, ps, b, systems, reps, max_tokens, ref, bar)
    h = out["headline"]["B=48 batch 1"]
    analysis = {k: _pool_analysis(eng, mixed, k, BASE, max_tokens) for k in (E, P)}
    out["analysis"] = analysis
    t9 = {"B=48": _cycle_ratio(h, P, E)}
    pooled = {k: {f: [x for name in splits for x in out["table1"][name][f"{k}@24"][f]]
                  for f in ("cycle_seconds", "chunk_cycle_seconds")} for k in (P, E)}
    t9["B=24"] = _cycle_ratio(pooled, P, E)  # every split's chunk pairs
    t9["serial_bound"] = (BASE.gamma + BASE.reconsider) / BASE.gamma
    out["table9"] = t9
    lossless = all(r["lossless"] for t in TABLES for cell in out[t].values() for r in cell.values())
    out.update(eagle={"tau": h[E]["tau"], "speedup": h[E]["speedup"]},
               pr={"tau": h[P]["tau"], "speedup": h[P]["speedup"]},
               cycle_cost_ratio=t9["B=48"]["median"], lossless=lossless)
    out["notes"] = [n for n in (cpu_kernels_note(),) if n]  # timed the PyTorch path: said
    out["tables_md"] = format_tables(out)
    return out


def main(argv: list[str] | None = None) -> int:
    from gambit.config_cli import DefaultsFormatter

    ap = argparse.ArgumentParser(prog="gambit bench spec", formatter_class=DefaultsFormatter,
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts, batches and settings (minutes)")
    ap.add_argument("--reps", type=int, default=None,
                    help="interleaved repetitions (default 2 quick, 3 full)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per trace at most")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads for plain and speculative decoding alike (default: 0 = "
                         "every core, as the serving Target runs; the previous commits measured 1)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--drafters", default=str(ASSETS), help="folder holding drafter-* folders")
    ap.add_argument("--allow-random-drafters", action="store_true",
                    help="run even when --drafters holds none of the drafters: every method on a random "
                    "stand-in (tau ~ 1), a smoke test of the bench, not a measurement")
    ap.add_argument("--target", default=str(TARGET),
                    help="target model folder the drafters were trained for (default: the shipped one)")
    ap.add_argument("--json", help="write the result JSON here")
    ap.add_argument("--plots", default=None, help="folder for the PNG plots (default: next to --json)")
    a = ap.parse_args(argv)
    reps = a.reps if a.reps is not None else (2 if a.quick else 3)  # 0 is an error, not the default
    if reps < 2:
        raise ValueError(f"--reps must be >= 2 (interleaved A B A B), got {reps}")
    at_least(1, **{"--max-tokens": a.max_tokens})
    at_least(0, **{"--threads": a.threads})  # 0: every core
    bench_args.device("--device", a.device)
    if not (Path(a.target) / "config.json").exists():
        raise ValueError(f"--target {a.target}: no config.json there (a model folder)")
    # a missing folder would have every drafter replaced by a random stand-in (tau ~ 1), said only in the JSON
    if not Path(a.drafters).is_dir():
        raise ValueError(f"--drafters {a.drafters}: no such folder (it holds the drafter-* folders)")
    if not drafters_in(Path(a.drafters)) and not a.allow_random_drafters:  # a wrong folder: all stand-ins
        names = ", ".join(name for key, (name, _) in DRAFTERS.items() if key not in OPTIONAL)
        raise ValueError(f"--drafters {a.drafters}: none of the drafters there ({names}, each a folder with "
                         "config.json): every method would run a random stand-in (tau ~ 1); give the folder "
                         "that holds them, or --allow-random-drafters for a smoke test")
    bench_args.out_path("--json", a.json)  # written after the whole run: checked first
    bench_args.out_path("--plots", a.plots, folder=True)
    from gambit.bench import record

    # prompts: the task's test split at these seeds; greedy decoding, so no sampling seed
    seeds = {"prompts": "100+split index, 7, 11", "sampling": None}
    got: dict = {}  # filled cell by cell: a Ctrl-C writes the finished ones

    def partial() -> dict | None:
        return finished_cells({**got, "provenance": record.provenance("spec", argv, seeds)})

    with record.on_interrupt("spec", a.json, partial):
        r = run_bench(a.quick, reps, a.max_tokens, a.threads, Path(a.drafters), a.device, Path(a.target),
                      out=got)
    r["provenance"] = record.provenance("spec", argv, seeds)  # after run_bench set the threads
    print(r["tables_md"])
    if a.json or a.plots:
        folder = Path(a.plots) if a.plots else Path(a.json).parent
        r["plots"] = plots(r, folder)
        print("plots:", ", ".join(r["plots"]))
    if a.json:
        record.write_json(r, a.json)
        print(f"wrote {a.json}")
    return 0
