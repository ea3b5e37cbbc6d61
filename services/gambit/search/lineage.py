"""Lineage of a run (``gambit inspect``): its tournament tree as text and as a PNG.

Reads a run as the stores hold it (meta, nodes, rounds, result), so it works the same on a live
Redis run, a finished one, or a JSON file written by ``gambit run``.
"""

from __future__ import annotations

from pathlib import Path

from gambit.paths import check_output, image_path
from gambit.search import tree as T
from gambit.search.config import deepconf_warm
from gambit.search.vote import vote_counts

COLOURS = {"win": "#2a9d3f", "lose": "#e08a1e", T.PRUNED: "#d1495b", T.EVICTED: "#8d99ae",
           T.STOPPED: "#7b4fa0", T.GHOST: "#8d99ae", T.RUNNING: "#4361ee", T.WAITING: "#cccccc"}


def _children(nodes: dict) -> dict[int | None, list[int]]:
    kids: dict[int | None, list[int]] = {}
    for i in sorted(nodes):
        kids.setdefault(nodes[i]["parent"], []).append(i)
    return kids


def _winner(data: dict) -> str | None:
    res = data.get("result") or {}
    return res.get("answer")


def _label(n: dict, win: str | None, gold: str | None) -> str:
    s = n["scores"]
    score = f"score {sum(s) / len(s):.2f} ({len(s)})" if s else "unscored"
    where = "root" if n["parent"] is None else f"branched @step {n['birth_step']} at token {n['birth_depth']}"
    end = n["state"] if n["end_step"] is None else f"{n['state']} @step {n['end_step']}"
    if n.get("end_reason") == "ghost":  # still a ghost when the run ended: not a tournament prune
        end = f"ghost at end @step {n['end_step']}"
    elif n["state"] == T.FINISHED and n.get("end_reason") == "length":  # not an ending the model chose
        end = f"finished at the token limit @step {n['end_step']}"
    if n.get("evicted_step") is not None:  # a ghost pruned later, or a run's last trace requeued
        end += f" (evicted @step {n['evicted_step']})"
    ans = ""
    if n["state"] == T.FINISHED and n["answer"] is None:
        ans = " no answer"
    if n["answer"] is not None:
        ans = f" answer {n['answer']}"
        if gold is not None:
            ans += " ✓" if n["answer"] == gold else " ✗"
        if n["answer"] == win:
            ans += " (winner)"
    return f"#{n['id']} {where}; {end}; {len(n['tokens'])} tokens; {score}{ans}"


def _clip(prompt: str, head: int = 60, tail: int = 140) -> str:
    """A long prompt (a chat template's system turn, a benchmark question) as its start and its end."""
    return prompt if len(prompt) <= head + tail + 3 else f"{prompt[:head]} … {prompt[-tail:]}"


def knobs(c: dict) -> str:
    """The settings that steer a run of its method (a run's stored config): K, Δ, w, δ steer only
    Gambit's tournament and scoring (STEP scores every boundary), r Gambit's and STEP's eviction,
    DeepConf its own."""
    m, parts = c["method"], [f"C={c['capacity']}"]
    if m == "gambit":
        parts += [f"K={c['swap']}", f"Δ={c['interval']}", f"w={c['warmup']}", f"δ={c['floor']}",
                  f"r={c['kv_ratio']}"]
    elif m == "step":
        parts += [f"r={c['kv_ratio']}"]
    elif m == "deepconf":
        parts += [f"warm-up {deepconf_warm(c['capacity'], c['deepconf_warmup'])}",
                  f"keep {c['deepconf_keep']:g}%"]
    return " ".join(parts)


def lineage_text(run_id: str, data: dict, max_nodes: int = 400) -> str:
    meta, nodes, res = data["meta"], data["nodes"], data.get("result") or {}
    c = meta["config"]
    gold = meta.get("gold")
    win = _winner(data)
    lines = [f"run {run_id}: method {c['method']}, decoding {c['decoding']}, {knobs(c)}",
             f"  {_clip(meta['prompt'].strip())!r}  gold {gold}",
             f"  steps {meta['step']}, rounds {meta['round']}, tokens {meta['tokens']}, "
             f"branched {meta['branched']}, pruned {meta['pruned']}, evicted {meta['evicted']}"]
    if res:
        lines.append(f"  answer {res['answer']} ({res['vote_rule']}); majority {res['majority']}, "
                     f"weighted {res['weighted']}; votes {vote_counts(res['votes'])}; {res['reason']}"
                     + ("" if res.get("correct") is None else (" CORRECT" if res["correct"] else " WRONG")))
    else:
        lines.append("  (unfinished)")
    kids = _children(nodes)
    shown = 0

    def walk(i: int, prefix: str, last: bool, root: bool) -> None:
        nonlocal shown
        if shown >= max_nodes:
            return
        shown += 1
        lines.append(prefix + ("" if root else ("└── " if last else "├── ")) + _label(nodes[i], win, gold))
        sub = kids.get(i, [])
        for j, k in enumerate(sub):
            walk(k, prefix + ("" if root else ("    " if last else "│   ")), j == len(sub) - 1, False)

    for r in kids.get(None, []):
        walk(r, "", True, True)
    if shown < len(nodes):
        lines.append(f"... {len(nodes) - shown} more nodes")
    return "\n".join(lines)


def lineage_png(run_id: str, data: dict, path: str | Path) -> Path:
    """One row per trace (depth-first order); a bar from birth to end step, coloured by fate; a
    connector from the parent's row at the branch step; final answers written at the bar's end."""
    check_png(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    meta, nodes = data["meta"], data["nodes"]
    win, gold = _winner(data), meta.get("gold")
    kids = _children(nodes)
    order: list[int] = []

    def dfs(i: int) -> None:
        order.append(i)
        for k in kids.get(i, []):
            dfs(k)

    for r in kids.get(None, []):
        dfs(r)
    row = {i: y for y, i in enumerate(order)}
    last = max([meta["step"]] + [n["end_step"] or 0 for n in nodes.values()])
    fig, ax = plt.subplots(figsize=(12.5, max(3.0, 0.16 * len(order) + 1.5)))
    for i in order:
        n = nodes[i]
        end = n["end_step"] if n["end_step"] is not None else last
        if n["state"] == T.FINISHED:
            colour = COLOURS["win"] if n["answer"] == win and n["answer"] is not None else COLOURS["lose"]
        else:
            colour = COLOURS.get(n["state"], "#000000")
        ax.plot([n["birth_step"], end], [row[i], row[i]], color=colour, lw=2.2, solid_capstyle="butt")
        if n["parent"] is not None:
            ax.plot([n["birth_step"]] * 2, [row[n["parent"]], row[i]], color="#999999", lw=0.6)
        label = bar_label(n, gold)
        if label:
            ax.text(end + 0.5, row[i], label, fontsize=6, va="center",
                    color="#777777" if n["answer"] is None else "black")
    ax.invert_yaxis()
    ax.set_yticks([])
    ax.set_xlabel("decode step of the run")
    ax.set_ylabel(f"{len(order)} traces (depth-first)")
    c = meta["config"]
    res = data.get("result") or {}
    ax.set_title(f"run {run_id}: {c['method']} {knobs(c)} — answer {res.get('answer')} (gold {gold})",
                 fontsize=9)
    ax.legend(handles=[Patch(color=COLOURS["win"], label="finished, winning answer"),
                       Patch(color=COLOURS["lose"], label="finished, other answer or none"),
                       Patch(color=COLOURS[T.PRUNED], label="pruned"),
                       Patch(color=COLOURS[T.EVICTED], label="evicted / ghost"),
                       Patch(color=COLOURS[T.STOPPED], label="stopped"),
                       Patch(color=COLOURS[T.RUNNING], label="running")],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # off the traces
    fig.tight_layout()
    path = image_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def check_png(path: str | Path) -> None:
    """A picture path refused before the drawing: matplotlib wrote ``--png DIR`` as a sibling
    ``DIR.png`` and said nothing, and a bare ``x`` goes to ``x.png``, which may be a folder."""
    check_output(str(path), "png", image=True)
    if image_path(path).is_dir():
        raise ValueError(f"png: {path} is written to {image_path(path)}, a directory; give a file path")


def bar_label(n: dict, gold: str | None) -> str:
    """The text after a trace's bar: its answer (✓ when it is the gold), or for a trace that ended by
    itself with none, "no answer" (its bar is the colour of a wrong answer)."""
    if n["answer"] is not None:
        return f"{n['answer']}{' ✓' if gold is not None and n['answer'] == gold else ''}"
    if n["state"] == T.FINISHED:
        return "no answer (token limit)" if n.get("end_reason") == "length" else "no answer"
    return ""


# Redis key prefixes ``inspect_run`` looks under when given none: `gambit run` and the benchmarks'
# (RedisStore's default), and the services' (their ``prefix`` "gambit:" + "tree": serving.tree_view)
REDIS_PREFIXES = ("gambit", "gambit:tree")


def inspect_run(run_id: str, store_spec: str, png: str | None = None, prefix: str = "") -> str:
    """Text of the run's lineage (and a PNG when ``png`` is given) from a store spec; in Redis under
    ``prefix``, or ("") under each of ``REDIS_PREFIXES`` until the run is found."""
    from gambit.search.store import is_redis_url, open_store

    if png:
        check_png(png)  # before the store is read, as `gambit run --png` does
    prefixes = (prefix,) if prefix or not is_redis_url(store_spec) else REDIS_PREFIXES
    data, seen = None, []
    for p in prefixes:
        store = open_store(store_spec, p)
        runs = store.runs()
        seen += runs
        rid = runs[-1] if run_id == "last" and runs else run_id
        data = store.load(rid)
        if data is not None:
            run_id = rid
            break
    if data is None:
        where, hint = store_spec, ""
        if is_redis_url(store_spec):
            where += f" under {', '.join(map(repr, prefixes))}"
            if run_id != "last" and (other := store.prefixes_of(run_id)):
                hint = f"; it is under {', '.join(map(repr, other))}: pass --prefix {other[0]}"
        raise ValueError(f"run {run_id!r} is not in {where} (runs there: {seen[:20]}){hint}")
    text = lineage_text(run_id, data)
    if png:
        text += f"\nwrote {lineage_png(run_id, data, png)}"
    return text
