"""Why a verification cycle stopped where it did: the question to ask before tuning a tree.

A cycle accepts a path and stops at its deepest accepted node, where the target's next token (the
bonus) was not among the node's children in the verified tree. Looking at the whole candidate pool
the drafter built (``DraftTree.pool``, recorded when the engine's speculator has ``records``), every
stop is one of:

* ``cut by budget``: the drafter offered that token as a child, but re-ranking to B dropped it: a
  better score (for instance a reconsidered one) would have kept it;
* ``outside top-k``: the node was forwarded and offered its top-k children, and the target's token
  was not among them (nor a corrected token): its rank in the node's draft distribution says how
  wide the offer would have had to be;
* ``not forwarded``: the node made the tree but never grew (it was not in a frontier);
* ``depth cap``: the node sits at the deepest level the γ draft steps reach.

Reconsideration acts on the first two (a sibling candidate for a hesitant node, with its own score);
the last two are budget and depth, which it does not change.
"""

from __future__ import annotations

import statistics
from collections import Counter

KINDS = ("cut by budget", "outside top-k", "not forwarded", "depth cap")


def classify(tree, drafter, path: list[list[int]], n_acc: list[int], bonus: list[int]) -> list[dict]:
    """One record per sequence of a verified cycle: ``kind``, ``accepted`` and, for ``outside top-k``,
    ``rank`` (0-based) of the target's token in the node's draft distribution (None: not in the draft
    vocabulary)."""
    pool = tree.pool
    out = []
    for s, (pth, a, b) in enumerate(zip(path, n_acc, bonus, strict=True)):
        ti = pth[a]  # tree index of the deepest accepted node (0: the root)
        pi = -1 if ti == 0 else int(pool.kept[s, ti - 1])
        kids = pool.par[s, :-1] == pi
        rec: dict = {"accepted": a, "rank": None}
        if bool((pool.tok[s, :-1][kids] == b).any()):
            rec["kind"] = "cut by budget"
        elif pi == -1 or int(pool.row_of[s, pi]) >= 0:
            rec["kind"] = "outside top-k"
            row = 0 if pi == -1 else int(pool.row_of[s, pi])
            lp = drafter.logits_to_target(pool.row_lp[s, row])
            if lp[b] > float("-inf"):
                rec["rank"] = int((lp > lp[b]).sum())
        elif int(pool.depth[s, pi]) >= pool.max_depth:
            rec["kind"] = "depth cap"
        else:
            rec["kind"] = "not forwarded"
        out.append(rec)
    return out


def summarise(records: list[dict], offer_width: int) -> dict:
    """Shares of cycles by kind, and where the ``outside top-k`` tokens ranked: within the next
    ``offer_width`` candidates (a wider offer would have had them), the median rank, and the share
    a reduced draft vocabulary cannot propose at all."""
    n = len(records)
    kinds = Counter(r["kind"] for r in records)
    out = [r for r in records if r["kind"] == "outside top-k"]
    near = sum(r["rank"] is not None and r["rank"] < 2 * offer_width for r in out)
    ranks = [r["rank"] for r in out if r["rank"] is not None]
    return {"cycles": n, "share": {k: kinds[k] / n if n else 0.0 for k in KINDS},
            "outside_within_next_k": near / len(out) if out else None,
            "outside_median_rank": statistics.median(ranks) if ranks else None,
            "outside_not_in_draft_vocab": (len(out) - len(ranks)) / len(out) if out else None}
