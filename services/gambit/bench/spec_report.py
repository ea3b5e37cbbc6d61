"""Tables, plots and the partial result of ``gambit bench spec``: the markdown tables the run prints,
the per-cycle cost ratio (Table 9), the figure PNGs, and what a stopped run finished."""

from __future__ import annotations

import statistics
from pathlib import Path

from gambit.bench.spec_cells import DEFAULTS
from gambit.engine.config import SpecConfig
from gambit.speculative.cycle_ends import KINDS

CAPPED = "pr, capped (default)"  # "Batch cap" table: the engine's defaults, batch cap included


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
    # inclusive, as record.spread: the default (exclusive) put a few pairs' IQR outside their range
    q = statistics.quantiles(pairs, n=4, method="inclusive") if len(pairs) > 1 else [pairs[0]] * 3
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
