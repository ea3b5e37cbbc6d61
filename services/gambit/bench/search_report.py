"""Tables, target checks and plots for ``gambit bench search``."""

from __future__ import annotations

import statistics
from pathlib import Path

MAIN = ("sc", "step", "deepconf", "gambit", "gambit_pr")
FASTER_BY = 0.05  # "Gambit+PR faster": at least this much less wall time (runs here differ by ~5%)
TABLE2 = ("gambit", "gambit_mlp", "gambit_seq", "step", "step_mlp", "step_seq")


def merge_results(paths: list[str]) -> dict:
    """One result from several partial runs (difficulties or method subsets run in parallel)."""
    import json

    out: dict = {"by_difficulty": {}, "parts": paths, "seconds": 0.0, "notes": []}
    for p in paths:
        part = json.loads(Path(p).read_text())
        out.setdefault("config", part["config"])
        out["notes"] += [f"{p}: {n}" for n in part.get("notes", [])]
        out.setdefault("scorers", part.get("scorers"))
        out["seconds"] = max(out["seconds"], part.get("seconds", 0.0))
        for diff, d in part["by_difficulty"].items():
            tgt = out["by_difficulty"].setdefault(diff, {**d, "methods": {}})
            for k, m in d["methods"].items():
                tgt["methods"].setdefault(k, {**m, "part": p})  # chunks pair only within one run
    return out


def _row(name: str, m: dict) -> str:
    return (f"| {name} | {100 * m['accuracy']:.1f}% | {100 * m['majority_accuracy']:.1f}% | "
            f"{100 * m['weighted_accuracy']:.1f}% | {m['tokens']:.0f} | {m['wall_s']:.2f} | "
            f"{m['trace_throughput']:.2f} | {m['finished_traces']:.1f} | {m['evicted']:.1f} | "
            f"{100 * m['overhead_fraction']:.2f}% |")


HEAD = ("| method | accuracy | majority | weighted | tokens/problem | latency s | traces/s | answers | "
        "evicted | overhead |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def headline(diff: str) -> bool:
    """The set the main figures, the sweep and ``methods`` come from: the task's hard end ("hard"), or a
    benchmark's questions (any name but the task's "all")."""
    return diff != "all"


def headline_set(out: dict) -> dict:
    """The set the hard-end tables and figures read: the task's hard end, or a benchmark's questions."""
    return next((d for k, d in out["by_difficulty"].items() if headline(k)), {})


def _headline_label(out: dict) -> str:
    """How the titles name that set: "hard: 6-8 ops", or the benchmark's name."""
    name = next((k for k in out["by_difficulty"] if headline(k)), "hard")
    ops = (out["by_difficulty"].get(name) or {}).get("ops")
    return f"{name}: {ops[0]}-{ops[1]} ops" if ops else name


def format_tables(out: dict) -> str:
    lines = []
    for diff, d in out["by_difficulty"].items():
        ms = d["methods"]
        what = f"{d['ops'][0]}-{d['ops'][1]} operations" if d.get("ops") else "benchmark questions"
        main = [k for k in MAIN if k in ms]  # whichever ran: `--methods gambit,sc` printed no table at all
        if not main:
            continue
        lines += [f"\nTable 1 — {diff} ({what}, {ms[main[0]]['problems']} problems, "
                  f"C={out['config']['capacity']}, {d['kv_blocks_per_run']} KV blocks per run)", HEAD]
        lines += [_row(k, ms[k]) for k in main]
        if any(k.endswith(("_mlp", "_seq")) for k in ms):  # the scorer comparison, when its rows ran
            lines += [f"\nTable 2 — scorers: process + confidence (default) vs MLP and sequence on final "
                      f"labels ({diff})", HEAD]
            lines += [_row(k, ms[k]) for k in TABLE2 if k in ms]
    hard = headline_set(out).get("methods", {})
    cols = [m for m in ("gambit", "step", "sc") if m in hard]
    lines += [f"\nTable 3 — wall-time split ({_headline_label(out)}), share of wall time",
              "| part | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    names = {"forward": "model forward + sampling", "guidance": "guidance sync (scorer)",
             "tree": "tree management (rounds, fork/abort, store)",
             "scheduling": "scheduling + event routing",
             "other": "other (driver loop)"}
    for k, label in names.items():
        lines.append(f"| {label} | " + " | ".join(f"{100 * hard[m]['time_split'][k]:.2f}%"
                                                  for m in cols) + " |")
    extra = [k for k in hard if k not in MAIN and k not in TABLE2]
    if extra:
        lines += [f"\nFigure 5 / Figure 10 points ({_headline_label(out)})", HEAD]
        lines += [_row(k, hard[k]) for k in extra]
    lines += ["\nTargets"] + [f"* {t['target']}: {'MET' if t['met'] else 'not met'} — {t['detail']}"
                              for t in out["targets"]]
    lines += [f"note: {n}" for n in out.get("notes", [])]
    return "\n".join(lines)


def paired(ratios: list[float]) -> dict | None:
    """Median and spread of per-chunk ratios (the variants ran each chunk back to back, in rotating
    order, so a slow spell of the machine lands on both sides of a pair); None without pairs."""
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "pairs": len(ratios)}


def chunk_ratios(a: dict, b: dict, per: str) -> list[float]:
    """Per chunk, ``a``'s over ``b``'s: wall time (``per`` "wall") or traces per second ("traces");
    empty for results without chunk records (older JSON), with different chunks, or from different
    runs merged (``--merge``: their chunks did not run back to back)."""
    wa, wb = a.get("chunk_walls") or [], b.get("chunk_walls") or []
    if not wa or len(wa) != len(wb) or min(wa + wb) <= 0 or a.get("part") != b.get("part"):
        return []
    if per == "wall":
        return [x / y for x, y in zip(wa, wb, strict=True)]
    fa, fb = a.get("chunk_finished") or [], b.get("chunk_finished") or []
    if len(fa) != len(wa) or len(fb) != len(wb):
        return []
    return [(f / x) / (g / y) for f, x, g, y in zip(fa, wa, fb, wb, strict=True) if g > 0]


def _spread(p: dict | None) -> str:
    return f"; per chunk {p['median']:.2f}x [{p['min']:.2f}, {p['max']:.2f}] over {p['pairs']}" if p else ""


def check_targets(out: dict) -> list[dict]:
    res = []
    for diff, d in out["by_difficulty"].items():
        m = d["methods"]
        if "gambit" in m and "gambit_pr" in m:
            res.append(_pr_target(diff, m["gambit"], m["gambit_pr"]))
        if "gambit" not in m:
            continue
        g = m["gambit"]
        if "sc" in m:  # the SC targets need no STEP run (`--methods gambit,sc` with the frontier)
            res += _sc_targets(diff, m)
        if "step" not in m:
            continue
        st = m["step"]
        res.append({"target": f"[{diff}] Gambit >= STEP + 3 points",
                    "met": g["accuracy"] >= st["accuracy"] + 0.03,
                    "detail": f"{100 * g['accuracy']:.1f}% vs {100 * st['accuracy']:.1f}%"})
        tp = paired(chunk_ratios(g, st, "traces"))
        total = g["trace_throughput"] / max(st["trace_throughput"], 1e-9)
        res.append({"target": f"[{diff}] trace throughput >= 1.5x STEP",
                    # no answered trace at all (a model that never answers): nothing was shown;
                    # judged on the median of the chunk pairs where there are some
                    "met": 0 < g["trace_throughput"] and (tp["median"] if tp else total) >= 1.5,
                    "paired": tp,
                    "detail": f"{g['trace_throughput']:.2f} vs {st['trace_throughput']:.2f} traces/s "
                              f"({total:.2f}x{_spread(tp)})"})
        res.append({"target": f"[{diff}] tournament overhead <= 3% of wall",
                    "met": g["overhead_fraction"] <= 0.03,
                    "detail": f"{100 * g['overhead_fraction']:.2f}%"})
    return res


def _sc_targets(diff: str, m: dict) -> list[dict]:
    g, sc = m["gambit"], m["sc"]
    res = [{"target": f"[{diff}] Gambit accuracy >= SC@C with <= 50% of SC's tokens",
            "met": g["accuracy"] >= sc["accuracy"] and g["tokens"] <= 0.5 * sc["tokens"],
            "detail": f"{100 * g['accuracy']:.1f}% vs {100 * sc['accuracy']:.1f}%, tokens "
                      f"{g['tokens'] / sc['tokens']:.2f}x of SC"}]
    half = [k for k in m if k.startswith("gambit@")]
    if half and headline(diff):
        k = max(half, key=lambda x: int(x.split("@")[1]))
        res.append({"target": f"[{diff}] frontier: {k} accuracy >= SC@C",
                    "met": m[k]["accuracy"] >= sc["accuracy"],
                    "detail": f"{100 * m[k]['accuracy']:.1f}% vs {100 * sc['accuracy']:.1f}% at "
                              f"{m[k]['tokens'] / sc['tokens']:.2f}x SC's tokens"})
    return res


def _pr_target(diff: str, g: dict, p: dict) -> dict:
    """Gambit + PR against Gambit: faster beyond this machine's noise (at least FASTER_BY less wall
    time: parity is not faster), at equal accuracy, judged on the median chunk pair where there are
    some. Speculation must have run: a search whose every step a batch cap made plain decoded exactly
    like Gambit, so any wall difference is the machine's (older JSON: not counted)."""
    plain = p.get("spec_drafts", 1) == 0
    pw = paired(chunk_ratios(p, g, "wall"))
    ratio = pw["median"] if pw else p["wall_s"] / max(g["wall_s"], 1e-9)
    return {"target": f"[{diff}] Gambit+PR faster than Gambit at equal accuracy",
            "met": not plain and ratio <= 1 - FASTER_BY and p["accuracy"] >= g["accuracy"] - 0.05,
            "paired": pw,
            "detail": f"{p['wall_s']:.2f} s vs {g['wall_s']:.2f} s "
                      f"({p['wall_s'] / max(g['wall_s'], 1e-9):.2f}x{_spread(pw)}, "
                      f"met at <= {1 - FASTER_BY:.2f}x); "
                      f"{100 * p['accuracy']:.1f}% vs {100 * g['accuracy']:.1f}%"
                      + (f"; no tree drafted ({p.get('spec_capped_steps', 0)} capped steps): "
                         "it decoded plainly, the difference is noise" if plain else "")}


def plot_all(out: dict, folder: str) -> list[str]:
    """The figures the result has points for, written into ``folder``; their paths. Figure 5 needs the
    frontier runs (``sc@N``/``gambit@N``), Figure 10 the sweep's (``gambit[K=V]``): a run without them
    (``--no-frontier``, ``--no-sensitivity``) once drew one dot per panel over the real figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder_p = Path(folder)
    folder_p.mkdir(parents=True, exist_ok=True)
    hard = headline_set(out).get("methods", {})
    if not all(k in hard for k in ("sc", "gambit")):
        return []
    C = out["config"]["capacity"]
    files = []
    colours = {"sc": "#888888", "step": "#e08a1e", "deepconf": "#7b4fa0", "gambit": "#2a9d3f",
               "gambit_pr": "#1d6fb8", "gambit_seq": "#6ab04c", "step_seq": "#f0b27a"}

    # Figure 5: accuracy vs tokens
    if any(k.startswith(("sc@", "gambit@")) for k in hard):
        files.append(_plot_frontier(plt, out, hard, folder_p, colours))

    # Figures 3/6: resident traces and KV use over time, and trace throughput
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for k in ("sc", "step", "deepconf", "gambit"):
        s = (hard.get(k) or {}).get("series") or []
        if s:
            axes[0].plot([r[0] for r in s], [r[1] for r in s], color=colours[k], label=k)
            axes[1].plot([r[0] for r in s], [100 * r[3] for r in s], color=colours[k], label=k)
    axes[0].set_title("resident (decoding) traces of one run", fontsize=9)
    axes[1].set_title("KV use of the engine (%)", fontsize=9)
    for a in axes[:2]:
        a.set_xlabel("seconds since the run started")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # one legend for both time panels, under them: inside, it covered the lines' ends
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    names = [k for k in MAIN if k in hard]
    axes[2].bar(names, [hard[k]["trace_throughput"] for k in names], color=[colours[k] for k in names])
    axes[2].set_title("trace throughput (answered traces / s)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    files.append(str(folder_p / "fig3_6_utilisation.png"))
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    # Figure 10: sensitivity
    if not any(k.startswith("gambit[") for k in hard):
        return files
    params = [("swap", "K"), ("interval", "Δ"), ("warmup", "w"), ("kv_ratio", "r")]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4))
    cfg = out["config"]
    for a, (p, label) in zip(axes, params, strict=True):
        pts = [(cfg[p], hard["gambit"]["accuracy"], hard["gambit"]["tokens"])]
        for k, m in hard.items():
            if k.startswith(f"gambit[{p}="):
                pts.append((float(k.split("=")[1].rstrip("]")), m["accuracy"], m["tokens"]))
        pts.sort()
        a.plot([x for x, _, _ in pts], [100 * y for _, y, _ in pts], "o-", color=colours["gambit"])
        a.axhline(100 * hard["sc"]["accuracy"], color=colours["sc"], ls="--", lw=1, label=f"SC@{C}")
        a.set_xlabel(label)
        a.set_ylabel("accuracy (%)")
        a.legend(fontsize=7)
    fig.suptitle(f"Figure 10 — Gambit sensitivity ({_headline_label(out)})", fontsize=10)
    fig.tight_layout()
    files.append(str(folder_p / "fig10_sensitivity.png"))
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def _plot_frontier(plt, out: dict, hard: dict, folder_p: Path, colours: dict) -> str:
    """Figure 5: accuracy vs tokens, SC and Gambit at C/4, C/2 and C, the other methods at C."""
    C = out["config"]["capacity"]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for fam in ("sc", "gambit"):
        pts = sorted((m["tokens"], m["accuracy"], k) for k, m in hard.items()
                     if k == fam or k.startswith(fam + "@"))
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", color=colours[fam],
                label=f"{fam} (C varies)")
        for x, y, k in pts:
            ax.annotate(k.split("@")[1] if "@" in k else str(C), (x, 100 * y), fontsize=7,
                        textcoords="offset points", xytext=(4, 4))
    for k in ("step", "deepconf", "gambit_pr"):
        if k in hard:
            ax.plot(hard[k]["tokens"], 100 * hard[k]["accuracy"], "s", color=colours[k], label=k)
    ax.set_xlabel("generated tokens per problem")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Figure 5 — accuracy vs tokens ({_headline_label(out)})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = str(folder_p / "fig5_frontier.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
