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

# traces the picture draws at most (depth-first, the first ones): 5000 drew a 1375x88165 px picture that
# most viewers refuse, in 87 s; 400 rows are ~7200 px (the text lists 400 nodes by default too)
MAX_ROWS = 400
COLOURS = {"win": "#2a9d3f", "lose": "#e08a1e", T.PRUNED: "#d1495b", T.EVICTED: "#8d99ae",
           T.STOPPED: "#7b4fa0", T.GHOST: "#8d99ae", T.RUNNING: "#4361ee", T.WAITING: "#cccccc"}


def _children(nodes: dict) -> dict[int | None, list[int]]:
    kids: dict[int | None, list[int]] = {}
    for i in sorted(nodes):
        kids.setdefault(nodes[i]["parent"], []).append(i)
    return kids


def _depth_first(kids: dict[int | None, list[int]], limit: int):
    """(node, its depth, whether it is its parent's last child) in depth-first order, the first
    ``limit`` of them: a loop, not a recursion (a branch chain can be thousands deep)."""
    stack = [(r, 0, True) for r in reversed(kids.get(None, []))]
    while stack and limit > 0:
        i, depth, last = stack.pop()
        yield i, depth, last
        limit -= 1
        sub = kids.get(i, [])
        stack += [(k, depth + 1, j == len(sub) - 1) for j, k in reversed(list(enumerate(sub)))]


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
    if meta.get("resumed_at"):  # taken over from its stored tree (``SearchDriver._restore``)
        at = ", ".join(map(str, meta["resumed_at"]))
        lines.append(f"  resumed at step {at}: taken over from its stored tree; a trace the engine lost went "
                     "on from its stored tokens (decoded again past them), so its tokens trail the steps")
    if res:
        lines.append(f"  answer {res['answer']} ({res['vote_rule']}); majority {res['majority']}, "
                     f"weighted {res['weighted']}; votes {vote_counts(res['votes'])}; {res['reason']}"
                     + ("" if res.get("correct") is None else (" CORRECT" if res["correct"] else " WRONG")))
    else:
        # running, or ended with no result written to its tree (a served run whose replica was lost and
        # that no other took over: its run record says "failed"; the tree expires with the retention)
        lines.append("  (unfinished: no result in its tree; for a served run `gambit client get RUN` says "
                     "whether it still runs)")
    shown = 0
    bars: list[str] = []  # the rails of the open ancestors, below the root ("│   " or "    ")
    for i, depth, last in _depth_first(_children(nodes), max_nodes):
        shown += 1
        del bars[max(0, depth - 1):]
        branch = "" if depth == 0 else ("└── " if last else "├── ")
        lines.append("".join(bars) + branch + _label(nodes[i], win, gold))
        if depth:
            bars.append("    " if last else "│   ")
    if shown < len(nodes):
        lines.append(f"... {len(nodes) - shown} more nodes")
    return "\n".join(lines)


def drawn_rows(data: dict, max_rows: int = MAX_ROWS) -> tuple[list[int], str]:
    """The traces the picture draws (the first ``max_rows``, depth-first: each one's parent is among
    them) and a note of how many it leaves out ("" when none)."""
    order = [i for i, _, _ in _depth_first(_children(data["nodes"]), max_rows)]
    left = len(data["nodes"]) - len(order)
    return order, (f"; {left} more traces not drawn (the first {len(order)} depth-first)" if left else "")


def lineage_png(run_id: str, data: dict, path: str | Path, max_rows: int = MAX_ROWS) -> Path:
    """One row per trace (depth-first order; the first ``max_rows``); a bar from birth to end step,
    coloured by fate; a connector from the parent's row at the branch step; final answers written at
    the bar's end."""
    check_png(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    meta, nodes = data["meta"], data["nodes"]
    win, gold = _winner(data), meta.get("gold")
    order, left_out = drawn_rows(data, max_rows)
    row = {i: y for y, i in enumerate(order)}
    last = max([meta["step"]] + [n["end_step"] or 0 for n in nodes.values()])
    fig, ax = plt.subplots(figsize=(12.5, max(3.0, 0.16 * len(order) + 1.5)))
    bars, colours, links = [], [], []  # (x, y) segments: each trace's bar, its link to its parent's row
    for i in order:
        n = nodes[i]
        end = n["end_step"] if n["end_step"] is not None else last
        if n["state"] == T.FINISHED:
            colour = COLOURS["win"] if n["answer"] == win and n["answer"] is not None else COLOURS["lose"]
        else:
            colour = COLOURS.get(n["state"], "#000000")
        bars.append(((n["birth_step"], row[i]), (end, row[i])))
        colours.append(colour)
        if n["parent"] is not None:
            links.append(((n["birth_step"], row[n["parent"]]), (n["birth_step"], row[i])))
        label = bar_label(n, gold)
        if label:
            ax.text(end + 0.5, row[i], label, fontsize=6, va="center",
                    color="#777777" if n["answer"] is None else "black")
    # two collections, not a line object per trace (400 rows drew in ~10 s that way on 2 busy cores)
    ax.add_collection(LineCollection(links, colors="#999999", linewidths=0.6))
    ax.add_collection(LineCollection(bars, colors=colours, linewidths=2.2, capstyle="butt"))
    ax.autoscale_view()
    ax.invert_yaxis()
    ax.set_yticks([])
    ax.set_xlabel("decode step of the run")
    ax.set_ylabel(f"{len(order)} traces (depth-first)")
    c = meta["config"]
    res = data.get("result") or {}
    ax.set_title(f"run {run_id}: {c['method']} {knobs(c)} — answer {res.get('answer')} (gold {gold})"
                 + left_out, fontsize=9)
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


# Redis key prefixes ``inspect_run`` looks under when given none: the benchmarks' (`bench rounds --store`:
# RedisStore's default; `gambit run` writes JSON), and the services' ("gambit:" + "tree": serving.tree_view)
REDIS_PREFIXES = ("gambit", "gambit:tree")


def inspect_run(run_id: str, store_spec: str, png: str | None = None, prefix: str = "") -> str:
    """Text of the run's lineage (and a PNG when ``png`` is given) from a store spec; in Redis under
    ``prefix``, or ("") under each of ``REDIS_PREFIXES`` until the run is found."""
    from gambit.search.store import is_redis_url, open_store, redact_url

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
        where, hint = redact_url(store_spec), ""  # never the password, should a URL hold one
        if is_redis_url(store_spec):
            where += f" under {', '.join(map(repr, prefixes))}"
            if run_id != "last" and (other := store.prefixes_of(run_id)):
                hint = f"; it is under {', '.join(map(repr, other))}: pass --prefix {other[0]}"
            elif run_id == "last" and (other := [o for o in store.prefixes() if o not in prefixes]):
                hint = f"; runs are under {', '.join(map(repr, other[:10]))}: pass --prefix {other[0]}"
        raise ValueError(f"run {run_id!r} is not in {where} (runs there: {seen[:20]}){hint}")
    try:
        text = lineage_text(run_id, data)
        if png:
            text += f"\nwrote {lineage_png(run_id, data, png)}"
    except KeyError as e:  # hand-edited, truncated, another tool's (the fields read exist since d5767c8)
        raise ValueError(f"run {run_id!r}: its record lacks {e} (written by another tool or version?)") \
            from None
    except (TypeError, AttributeError) as e:  # a field of another type: a list where a number was...
        raise ValueError(f"run {run_id!r}: its record has a field of another shape ({e})") from None
    return text
