"""The cell runner of ``gambit bench spec``: the trees and drafters measured, the prompts, and one cell
(plain decoding and a group of systems run interleaved on one engine), plus the reject-pool analysis."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

from gambit.engine import Engine, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import load_drafter, random_drafter
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
