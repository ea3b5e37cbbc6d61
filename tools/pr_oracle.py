"""How much τ could reconsideration add on this task? PR's corrected tokens replaced by an oracle's.

Greedy decoding is lossless, so at every cycle the target's continuation is plain greedy decoding's.
The oracle knows it: a reconsidered node on the target's path (every ancestor's token is the greedy
token at its depth) gets as its corrected token the target's next token whenever the node did not
already offer it among its top-k children (so the corrected token stays fresh, as PR's rule wants);
elsewhere the drafter's own corrected token stays. It keeps the score the drafter gave its own pick
("oracle token"), or takes its node's score, as if the reconsider pass were sure of it ("sure"). So
the sure oracle's τ is what PR's tree would reach if every reconsideration on the target's path found
the target's token and trusted it: an upper bound on what a better-trained reconsider pass could add
at this budget.

Rows (batch 1, greedy, the paper's tree unless --trees changes it; the Python tree, bit-identical to the
C++ one the engine uses): EAGLE-3.1; PR; PR with the oracle (both scorings); and the EAGLE-3.1 drafter
with m rows of reconsideration and the sure oracle (its second pass untrained: the oracle tokens grow
from its feature).

Usage: PYTHONPATH=services .venv/bin/python tools/pr_oracle.py [--per N] [--trees "B=48,B=48 k=4"]
[--json FILE]; ``--plot OUT.png JSON`` draws a result file instead.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from gambit.bench.spec_cells import SPLITS, load_drafters, prompts_for, run_once, spec_from_name
from gambit.engine import Engine, EngineConfig
from gambit.paths import ASSETS, TARGET
from gambit.speculative import cpu_tree, drafting
from gambit.speculative.decoder import SpecDecoder

FULL: list[int] = []  # prompt + plain greedy output of the prompt being decoded (batch 1)
COUNT = {"replaced": 0, "on_path": 0}


def oracle_hook(root_pos, tok, par, score, node, node_depth, x, x_score, k: int, sure: bool = False):
    """The target's next token for each reconsidered node on its greedy path, when not offered (``k``:
    the tree's offer width); ``sure``: scored as if the reconsider pass gave it probability 1 (its
    node's own score)."""
    x, x_score = x.clone(), x_score.clone()
    r = int(root_pos[0]) + 1  # the root token's index in the sequence (drafter positions lag by one)
    for j, (n, d) in enumerate(zip(node[0].tolist(), node_depth[0].tolist(), strict=True)):
        if r + d + 1 >= len(FULL):
            continue
        a, depth, on_path = n, d, True
        while a >= 0:  # walk to the root: every ancestor's token must be the greedy one at its depth
            if int(tok[0, a]) != FULL[r + depth]:
                on_path = False
                break
            a, depth = int(par[0, a]), depth - 1
        if not on_path:
            continue
        COUNT["on_path"] += 1
        want = FULL[r + d + 1]
        # the node's offered children (the root's are the pool's first k entries; unwritten ones say -1 too)
        offered = tok[0][par[0] == n].tolist() if n >= 0 else tok[0, :k].tolist()
        if want not in offered:
            x[0, j] = want
            if sure:  # just below its node, so the budget's cut never keeps it without its node
                x_score[0, j] = (score[0, n] if n >= 0 else 0.0) - 1e-3
            COUNT["replaced"] += 1
    return x, x_score


def plot(path: str, out: str) -> None:
    """τ / EAGLE-3.1 τ of every row, one group of bars per tree, the 1.05 target as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.loads(Path(path).read_text())
    trees = list(d["tau"])
    rows = [r for r in d["tau"][trees[0]] if r != "eagle3.1"]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    w = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ys = [d["tau"][t][r]["tau"] / d["tau"][t]["eagle3.1"]["tau"] for t in trees]
        ax.bar([j + (i - (len(rows) - 1) / 2) * w for j in range(len(trees))], ys, w, label=r)
    ax.axhline(1.05, color="red", ls="--", lw=1, label="target 1.05")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(range(len(trees)), trees)
    ax.set_ylim(0.8, max(1.2, ax.get_ylim()[1]))
    ax.set_ylabel("tau / EAGLE-3.1 tau")
    ax.set_title(f"PR and its oracle bound, {d['prompts']} test prompts, greedy, batch 1", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", nargs=2, metavar=("OUT", "JSON"), help="draw a result JSON instead of running")
    ap.add_argument("--per", type=int, default=8, help="test prompts per difficulty split")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--trees", default="B=48,B=48 k=4", help="comma-separated trees (KNOB=N changes to the "
                    "paper's tree: B budget, g gamma, Bw grow width, k offer width, m reconsidered rows)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default="", help="write the table here")
    args = ap.parse_args()
    if args.plot:
        plot(args.plot[1], args.plot[0])
        return
    torch.set_num_threads(args.threads)
    eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET)))
    load_drafters(eng, ASSETS)
    prompts = [p for i, (_, ops) in enumerate(SPLITS.items())
               for p in prompts_for(ops, args.per, 100 + i, eng.tokenizer)]
    greedy = [list(p) + list(run_once(eng, [p], 1, "plain", args.max_tokens)[1][0]) for p in prompts]
    cpu_tree.serves = lambda *a: False  # the Python tree: the hook lives there
    plain_draft = drafting.draft_tree
    plain_config = SpecDecoder.tree_config

    def config_with(force: bool):
        def tree_config(self, key):  # force: the EAGLE-3.1 drafter with reconsider rows too
            c = plain_config(self, key)
            return replace(c, reconsider=self.engine.config.spec.reconsider) if force else c
        return tree_config

    # row -> (drafter, oracle: None = off / False = its token / True = its token, sure; force m rows;
    # which rows are reconsidered)
    rows = {"eagle3.1": ("eagle3.1", None, False, "confidence"), "pr": ("pr", None, False, "confidence"),
            "pr + oracle token": ("pr", False, False, "confidence"),
            "pr + oracle token, sure": ("pr", True, False, "confidence"),
            "eagle3.1 drafter, m rows + oracle, sure": ("eagle3.1", True, True, "confidence"),
            "pr, select miss": ("pr", None, False, "miss"),
            "pr, select miss + oracle token, sure": ("pr", True, False, "miss")}
    table = {}
    print(f"greedy tau, {len(prompts)} test prompts, batch 1, {args.max_tokens} tokens")
    for name in args.trees.split(","):
        try:
            spec = spec_from_name(name)
        except ValueError as e:
            raise SystemExit(f"--trees: {e}") from None
        table[name] = {}
        for row, (key, oracle, force, select) in rows.items():
            drafting.draft_tree = plain_draft if oracle is None else \
                partial(plain_draft, reconsider_hook=partial(oracle_hook, k=spec.offer_width, sure=oracle))
            SpecDecoder.tree_config = config_with(force)
            eng.config.spec = replace(spec, select=select)
            cycles = accepted = 0
            COUNT.update(replaced=0, on_path=0)
            t0 = time.perf_counter()
            for p, full in zip(prompts, greedy, strict=True):
                FULL[:] = full
                _, outs, c, a = run_once(eng, [p], 1, key, args.max_tokens)
                if list(p) + list(outs[0]) != full:
                    raise SystemExit(f"{row}: output differs from plain greedy decoding")
                cycles, accepted = cycles + c, accepted + a
            tau = (accepted + cycles) / cycles
            table[name][row] = {"tau": tau, "cycles": cycles, "oracle_replaced": COUNT["replaced"],
                                "reconsidered_on_path": COUNT["on_path"]}
            extra = (f"; {COUNT['on_path']} reconsiderations on the target's path, {COUNT['replaced']} "
                     f"given the target's token") if oracle is not None else ""
            print(f"{name:8s} {row:40s} tau {tau:.3f}  / eagle3.1 {tau / table[name]['eagle3.1']['tau']:.3f}"
                  f"  ({cycles} cycles, {time.perf_counter() - t0:.0f} s{extra})", flush=True)
    drafting.draft_tree, SpecDecoder.tree_config = plain_draft, plain_config
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"prompts": len(prompts), "max_tokens": args.max_tokens, "tau": table}, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
