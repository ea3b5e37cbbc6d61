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
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from gambit.bench import args as bench_args
from gambit.bench.kernel_note import cpu_kernels_note
from gambit.checks import at_least
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.paths import ASSETS, TARGET
from gambit.speculative import load_drafter, random_drafter
from gambit.speculative.cycle_ends import KINDS
from gambit.speculative.cycle_ends import summarise as summarise_ends
from gambit.tasks.arithmetic import TaskConfig, generate

SPLITS = {"easy (2-3 ops)": (2, 3), "medium (4-5 ops)": (4, 5), "hard (6-8 ops)": (6, 8)}
DRAFTERS = {  # key → (asset folder, method for a random stand-in)
    "eagle3.1": ("drafter-eagle3.1", "eagle3.1"), "pr": ("drafter-pr", "pr"),
    "hass": ("drafter-hass", "hass"), "hass+pr": ("drafter-hass-pr", "hass+pr"),
    "pr-beta0": ("drafter-pr-beta0", "pr"), "pr-noselfq": ("drafter-pr-noselfq", "pr"),
    "eagle3.1-2layer": ("drafter-eagle3.1-2layer", "eagle3.1"),
}
OPTIONAL = ("pr-beta0", "pr-noselfq", "eagle3.1-2layer")  # ablation drafters: used when present
# the paper's tree (the headline cell); the engine's defaults (SpecConfig()) are the fastest
# tree measured on the CPU and get their own cell
# the tables measure each tree at every batch size: no batch cap (``spec.max_batch``, its own table)
BASE = SpecConfig(gamma=8, budget=48, grow_width=6, offer_width=6, reconsider=3, max_batch=0)
DEFAULTS = SpecConfig(max_batch=0)  # the engine's tree, uncapped
TREE_KNOBS = {"B": "budget", "g": "gamma", "Bw": "grow_width", "k": "offer_width", "m": "reconsider"}


def spec_from_name(name: str) -> SpecConfig:
    """A tree from its name: "defaults" (the engine's, uncapped) or the paper's tree with "KNOB=V"
    changes (B, g = gamma, Bw, k, m) and "merge" (corrected tokens not required fresh), space-separated,
    e.g. "B=48 g=12" (the analysis tools' ``--trees``)."""
    if name == "defaults":
        return DEFAULTS
    spec = BASE
    for part in name.split():
        if part == "merge":
            spec = replace(spec, fresh=False)
            continue
        knob, _, value = part.partition("=")
        if knob not in TREE_KNOBS or not value.isdigit():
            raise ValueError(f"tree {name!r}: {part!r} is not KNOB=N with KNOB in {sorted(TREE_KNOBS)}, "
                             "nor 'merge'")
        spec = replace(spec, **{TREE_KNOBS[knob]: int(value)})
    return spec


def tree_systems(names: str) -> dict[str, tuple[str, SpecConfig]]:
    """PR and EAGLE-3.1 at each of ";"-separated tree names (``spec_from_name``): label → (drafter
    key, SpecConfig), as ``measure`` takes them (the tools' ``--trees``)."""
    return {f"{key} [{name}]": (key, spec_from_name(name))
            for name in names.split(";") for key in ("pr", "eagle3.1")}


CAPPED = "pr, capped (default)"  # "Batch cap" table: the engine's defaults, batch cap included


def load_drafters(eng: Engine, folder: Path, keys: tuple[str, ...] = ()) -> dict[str, str]:
    """Register every drafter found (or a random stand-in for the four main ones), or only ``keys``;
    key → provenance. Each takes a KV cache as large as the target's blocks (one layer)."""
    found = {}
    for key, (name, method) in DRAFTERS.items():
        if keys and key not in keys:
            continue
        path = next((p for p in (folder / name, folder / "ablations" / name) if (p / "config.json").exists()),
                    folder / name)
        if (path / "config.json").exists():
            eng.register_drafter(key, load_drafter(path, eng.model))
            found[key] = str(path)
        elif key not in OPTIONAL:
            eng.register_drafter(key, random_drafter(eng.model, seed=len(found), method=method))
            found[key] = "random"
    return found


def drafters_in(folder: Path) -> list[str]:
    """The ``DRAFTERS`` keys with a model in ``folder`` (or its ``ablations``), as ``load_drafters``
    finds them."""
    return [key for key, (name, _) in DRAFTERS.items()
            if any((p / name / "config.json").exists() for p in (folder, folder / "ablations"))]


def prompts_for(split: tuple[int, int], n: int, seed: int, tok, task_split: str = "test") -> list[list[int]]:
    """``n`` problems of ``task_split`` with ``split``'s operation counts, tokenized (the bench's prompts
    are test problems; the dev split is for choosing settings without reading the test)."""
    return [tok.encode(p.prompt) for p in generate(task_split, n, seed, TaskConfig(*split))]


def run_once(eng: Engine, prompts, batch: int, decoding: str, max_tokens: int):
    """Decode every prompt greedily, ``batch`` at a time; (seconds, outputs, cycles, accepted)."""
    s0 = (eng.stats.spec_drafts, eng.stats.spec_accepted)
    outs = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        outs += eng.generate(prompts[i:i + batch], SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                  decoding=decoding))
    dt = time.perf_counter() - t0
    return dt, outs, eng.stats.spec_drafts - s0[0], eng.stats.spec_accepted - s0[1]


def measure(eng: Engine, prompts, batch: int, systems: dict[str, tuple[str, SpecConfig]], reps: int,
            max_tokens: int, ref: dict, bar) -> dict:
    """Plain decoding and ``systems`` (label → (drafter key, SpecConfig)) interleaved chunk by chunk
    (each ``batch`` of prompts runs under every system in turn, the order rotating from chunk to chunk,
    so a slow spell of this shared machine lands on all of them alike); per system the medians and
    spreads over the ``reps`` repetitions, and per chunk its seconds per cycle (Table 9's pairs)."""
    order = [("plain", ("plain", BASE))] + list(systems.items())
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    times: dict[str, list[float]] = {k: [] for k, _ in order}
    per_chunk: dict[str, list[float | None]] = {k: [] for k, _ in order}  # seconds per cycle
    res: dict[str, dict] = {}
    rk = ("ref", batch, tuple(map(tuple, prompts)))
    for rep in range(reps):
        total = dict.fromkeys(times, 0.0)
        cyc = dict.fromkeys(times, 0)
        acc = dict.fromkeys(times, 0)
        outs: dict[str, list] = {k: [] for k in times}
        for c, chunk in enumerate(chunks):
            k = (rep + c) % len(order)
            for label, (key, spec) in order[k:] + order[:k]:
                eng.config.spec = spec
                dt, o, cycles, a = run_once(eng, chunk, batch, key, max_tokens)
                total[label] += dt
                cyc[label] += cycles
                acc[label] += a
                outs[label] += o
                per_chunk[label].append(dt / cycles if cycles else None)
        ref.setdefault(rk, outs["plain"])
        for label, _ in order:
            times[label].append(total[label])
            r = res.setdefault(label, {"cycles": cyc[label], "accepted": acc[label],
                                       "tokens": sum(map(len, outs[label]))})
            r["lossless"] = r.get("lossless", True) and outs[label] == ref[rk]
        bar.update(len(order))
    plain = times["plain"]
    out = {}
    for label, _ in order:
        r, t = res[label], times[label]
        ratios = [p / x for p, x in zip(plain, t, strict=True)]
        row = {"seconds_median": statistics.median(t), "seconds_spread": [min(t), max(t)],
               "tokens": r["tokens"], "lossless": r["lossless"]}
        if label != "plain":
            c = r["cycles"]
            row.update(tau=(r["accepted"] + c) / c if c else 0.0, cycles=c,
                       speedup=statistics.median(ratios), speedup_spread=[min(ratios), max(ratios)],
                       cycle_seconds=[x / c for x in t] if c else [], chunk_cycle_seconds=per_chunk[label])
        out[label] = row
    return out


def _pool_analysis(eng: Engine, prompts, key: str, spec: SpecConfig, max_tokens: int) -> dict:
    """Figure 1 and Table 7: acceptance vs drafter confidence; the reject pool by cpd x cpt."""
    eng.config.spec = spec
    dec = eng.speculator()
    dec.records, dec.cycle_ends = [], []
    run_once(eng, prompts, 1, key, max_tokens)
    recs, dec.records = dec.records, None
    ends = summarise_ends(dec.cycle_ends, spec.offer_width)
    bins = [i / 10 for i in range(11)]
    fig1 = []
    for lo, hi in zip(bins, bins[1:], strict=False):
        sel = [r for r in recs if lo <= r["cpd"] < hi or (hi == 1.0 and r["cpd"] == 1.0)]
        fig1.append({"cpd": [lo, hi], "n": len(sel),
                     "acceptance": sum(r["accepted"] for r in sel) / len(sel) if sel else None})
    rejects = [r for r in recs if not r["accepted"]]
    bands = [("<0.5", 0.0, 0.5), ("0.5-0.9", 0.5, 0.9), (">=0.9", 0.9, 1.01)]
    t7 = {}
    for dn, dlo, dhi in bands:
        for tn, tlo, thi in bands:
            sel = [r for r in rejects if dlo <= r["cpd"] < dhi and tlo <= r["cpt"] < thi]
            rec = [r for r in sel if r["reconsidered"]]
            t7[f"cpd {dn} / cpt {tn}"] = {
                "share": len(sel) / len(rejects) if rejects else 0.0,
                "reconsidered": len(rec) / len(sel) if sel else None,
                "recovered": sum(r["recovered"] for r in rec) / len(rec) if rec else None}
    rec_all = [r for r in rejects if r["reconsidered"]]
    return {"positions": len(recs), "rejects": len(rejects), "figure1": fig1, "table7": t7,
            "unsure_share": sum(r["cpd"] < 0.5 for r in rejects) / len(rejects) if rejects else 0.0,
            "reconsidered_share": len(rec_all) / len(rejects) if rejects else 0.0,
            "recovered_of_reconsidered": (sum(r["recovered"] for r in rec_all) / len(rec_all)
                                          if rec_all else None), "cycle_ends": ends}


def plots(result: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, a in result["analysis"].items():
        xs = [(b["cpd"][0] + b["cpd"][1]) / 2 for b in a["figure1"] if b["acceptance"] is not None]
        ys = [b["acceptance"] for b in a["figure1"] if b["acceptance"] is not None]
        ax.plot(xs, ys, marker="o", label=key)
    ax.set_xlabel("drafter top-1 confidence (cpd)")
    ax.set_ylabel("top-1 acceptance rate")
    ax.set_title("Figure 1a: acceptance vs drafter confidence")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "spec_fig1_acceptance.png", dpi=110)
    written.append(str(folder / "spec_fig1_acceptance.png"))
    plt.close(fig)
    a = result["analysis"].get("pr") or next(iter(result["analysis"].values()))
    bands = ["<0.5", "0.5-0.9", ">=0.9"]
    share = [[a["table7"][f"cpd {d} / cpt {t}"]["share"] * 100 for t in bands] for d in bands]
    fig, ax = plt.subplots(figsize=(5, 4))
    im = ax.imshow(share, cmap="Blues")
    for i in range(3):
        for j in range(3):
            cell = a["table7"][f"cpd {bands[i]} / cpt {bands[j]}"]
            rec = "" if cell["recovered"] is None else f"\nrec {cell['recovered'] * 100:.0f}%"
            ax.text(j, i, f"{share[i][j]:.1f}%{rec}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(3), bands)
    ax.set_yticks(range(3), bands)
    ax.set_xlabel("target confidence cpt")
    ax.set_ylabel("drafter confidence cpd")
    ax.set_title("Reject pool (% of rejects; recovered by PR)")
    fig.colorbar(im)
    fig.tight_layout()
    fig.savefig(folder / "spec_table7_reject_pool.png", dpi=110)
    written.append(str(folder / "spec_table7_reject_pool.png"))
    plt.close(fig)
    return written


def _cell(row: dict) -> str:
    """tau is "—" where no tree was drafted (every step capped, or too short a run): 0.00 read as a
    drafter that accepted nothing."""
    lo, hi = row["speedup_spread"]
    tau = "—" if row.get("cycles") == 0 else f"{row['tau']:.2f}"
    return f"{tau} / {row['speedup']:.2f}x ({lo:.2f}-{hi:.2f})"


def _cycle_ratio(rows: dict, a: str, b: str) -> dict:
    """Seconds per cycle of ``a`` over ``b``: the median over chunk pairs (the same prompts, run next
    to each other in ``measure``; chunks where either drafted no tree are left out), with the spread
    and the per-repetition ratio's median beside it."""
    ra, rb = rows[a]["cycle_seconds"], rows[b]["cycle_seconds"]
    per_rep = [x / y for x, y in zip(ra, rb, strict=True)]
    ca, cb = rows[a].get("chunk_cycle_seconds", []), rows[b].get("chunk_cycle_seconds", [])
    pairs = [x / y for x, y in zip(ca, cb, strict=True) if x and y] if len(ca) == len(cb) else []
    pairs = pairs or per_rep
    q = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
    return {"median": statistics.median(pairs), "spread": [min(pairs), max(pairs)], "iqr": [q[0], q[2]],
            "pairs": len(pairs), "per_rep_median": statistics.median(per_rep),
            "t_cycle_ms": [statistics.median(ra) * 1e3, statistics.median(rb) * 1e3]}


TABLES = ("headline", "defaults", "table1", "table2", "table3", "table4", "table5", "table6", "batch_cap")


def finished_cells(out: dict) -> dict | None:
    """What a stopped run finished (Ctrl-C: ``<json>.partial``): the settings and every measured cell,
    table by table; None before the first cell."""
    if not any(out.get(t) for t in TABLES):
        return None
    return {**out, "cells_done": sum(len(out.get(t, {})) for t in TABLES)}


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


def format_tables(r: dict) -> str:
    E, P = "eagle3.1", "pr"
    lines = [f"Drafters: {r['drafters']}", "cells: tau / speedup over plain, median (min-max) of "
             f"{r['reps']} interleaved repetitions; greedy, max {r['max_tokens']} tokens", ""]
    h = r["headline"]["B=48 batch 1"]
    lines += ["Headline (B=48, batch 1, all splits)", "| method | tau / speedup |", "|---|---|",
              f"| EAGLE-3.1 | {_cell(h[E])} |", f"| PR | {_cell(h[P])} |",
              f"PR / EAGLE-3.1 tau: {h[P]['tau'] / h[E]['tau']:.3f}; lossless: {r['lossless']}", ""]
    d, c = r["spec_defaults"], r["defaults"]["engine defaults batch 1"]
    lines += [f"Engine defaults (batch 1, all splits): gamma={d['gamma']}, B={d['budget']}, "
              f"Bw={d['grow_width']}, k={d['offer_width']}, m={d['reconsider']}",
              "| method | tau / speedup |", "|---|---|", f"| EAGLE-3.1 | {_cell(c[E])} |",
              f"| PR | {_cell(c[P])} |", ""]
    lines += ["Table 1: by difficulty (batch 1)",
              "| split | EAGLE-3.1 (24) | PR (24) | EAGLE-3.1 (48) | PR (48) |", "|---|---|---|---|---|"]
    for name, c in r["table1"].items():
        lines.append(f"| {name} | {_cell(c[E + '@24'])} | {_cell(c[P + '@24'])} | {_cell(c[E + '@48'])} | "
                     f"{_cell(c[P + '@48'])} |")
    lines += ["", "Table 2: batch size (B=48)", "| batch | EAGLE-3.1 | PR |", "|---|---|---|"]
    lines += [f"| {n} | {_cell(c[E])} | {_cell(c[P])} |" for n, c in r["table2"].items()]
    for t, title in (("table3", "Table 3: ablations (B=48)"), ("table4", "Table 4: the m extra rows (B=48)"),
                     ("table6", "Table 6: HASS vs HASS + PR (B=48)")):
        lines += ["", title, "| system | tau / speedup |", "|---|---|"]
        for c in r[t].values():
            lines += [f"| {k} | {_cell(v)} |" for k, v in c.items() if k != "plain"]
    lines += ["", "Table 5: sensitivity (others at B=48, Bw=6, k=6, gamma=8, m=3)",
              "| setting | EAGLE-3.1 | PR | d tau |", "|---|---|---|---|"]
    for n, c in r["table5"].items():
        lines.append(f"| {n} | {_cell(c[E])} | {_cell(c[P])} | {c[P]['tau'] - c[E]['tau']:+.2f} |")
    cap = SpecConfig().max_batch
    lines += ["", f"Batch cap: PR at the engine's tree (gamma={DEFAULTS.gamma}, B={DEFAULTS.budget}, "
              f"Bw={DEFAULTS.grow_width}, k={DEFAULTS.offer_width}) by batch; with the cap, steps of more "
              f"than {cap} traces decode plainly", "| batch | no cap | cap (default) |", "|---|---|---|"]
    for name, cell in r["batch_cap"].items():
        lines.append(f"| {name.split()[-1]} | {_cell(cell['pr, no cap'])} | {_cell(cell[CAPPED])} |")
    t9 = r["table9"]
    lines += ["", "Table 9: per-cycle cost PR / EAGLE-3.1 (measured, whole cycle; the median over adjacent "
              "runs of the same prompts) vs serial bound (g+N)/g",
              "| B | measured | serial bound |", "|---|---|---|"]
    for b in ("48", "24"):
        c = t9[f"B={b}"]
        lines.append(f"| {b} | {c['median']:.3f} (IQR {c['iqr'][0]:.3f}-{c['iqr'][1]:.3f}, range "
                     f"{c['spread'][0]:.3f}-{c['spread'][1]:.3f}, {c['pairs']} chunk pairs; per repetition "
                     f"{c['per_rep_median']:.3f}) | {t9['serial_bound']:.3f} |")
    for key, a in r["analysis"].items():
        lines += ["", f"Reject pool ({key}, B=48): {a['rejects']} rejects of {a['positions']} positions; "
                  f"drafter unsure (cpd<0.5) on {a['unsure_share'] * 100:.1f}%; reconsidered "
                  f"{a['reconsidered_share'] * 100:.1f}%",
                  "| cpd \\ cpt | <0.5 | 0.5-0.9 | >=0.9 |", "|---|---|---|---|"]
        for d in ("<0.5", "0.5-0.9", ">=0.9"):
            cells = []
            for t in ("<0.5", "0.5-0.9", ">=0.9"):
                c = a["table7"][f"cpd {d} / cpt {t}"]
                rec = "-" if c["recovered"] is None else f"{c['recovered'] * 100:.0f}%"
                cells.append(f"{rec} ({c['share'] * 100:.1f}%)")
            lines.append(f"| {d} | " + " | ".join(cells) + " |")
    lines += ["", "Why cycles end (B=48): share of cycles by where the target's next token was",
              "| drafter | " + " | ".join(KINDS) + " | outside top-k: rank < 2k |", "|---|" + "---:|" * 5]
    for key, a in r["analysis"].items():
        e = a.get("cycle_ends")
        if e:
            near = e["outside_within_next_k"]
            lines.append(f"| {key} | " + " | ".join(f"{100 * e['share'][k]:.1f}%" for k in KINDS)
                         + f" | {'-' if near is None else f'{100 * near:.0f}%'} |")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    return "\n".join(lines)


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
