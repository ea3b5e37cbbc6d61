"""How many of Gambit's Case-2 swaps tie: ``gambit run`` with every round's plan counted.

Wraps the tournament's ``plan_round`` and, for each Case-2 pair (the i-th worst pruned, a child of the
i-th best), counts whether the parent scored above, equal to or below the trace it replaced, and
whether the pruned trace was younger than its warmup. With ``--swap-ties`` the rounds run the rule
before stop 61 (a pair is made whatever the scores), which is where ties show up; without it only
pairs that gain are made (ghosts and traces below the floor aside).

Usage: PYTHONPATH=services .venv/bin/python tools/swap_ties.py [--swap-ties] [gambit run flags ...]
e.g. ``tools/swap_ties.py --swap-ties --problems 8 --png "" --save /tmp/s.json``.
"""

from __future__ import annotations

import collections
import sys

from gambit.search import run_state
from gambit.search.tournament import plan_round


def main() -> int:
    argv = sys.argv[1:]
    ties = "--swap-ties" in argv
    argv = [a for a in argv if a != "--swap-ties"]
    counts: collections.Counter[str] = collections.Counter()

    def counted(nodes, capacity, swap, warmup, floor=0.0, rank="mean", floor_refill=True, swap_ties=False):
        plan = plan_round(nodes, capacity, swap, warmup, floor, rank, floor_refill, ties or swap_ties)
        if plan.case == 2:
            by = {n.id: n for n in nodes}
            for p, b in zip(plan.prune, plan.branch, strict=True):
                sp, sb = by[p].rank_score(rank), by[b].rank_score(rank)
                counts["pairs"] += 1
                counts["tied" if sb == sp else "gained" if sb > sp else "lost"] += 1
                counts["pruned before its warmup"] += by[p].own_tokens < warmup
        return plan

    run_state.plan_round = counted  # (the saved run records still say swap_ties false)
    from gambit.cli import main as gambit_main

    rc = gambit_main(["run", *argv])
    n = counts["pairs"] or 1
    print(f"\nCase-2 pairs ({'tied swaps made' if ties else 'only swaps that gain'}): {counts['pairs']}; "
          f"the parent above {counts['gained']} ({100 * counts['gained'] / n:.0f}%), tied {counts['tied']} "
          f"({100 * counts['tied'] / n:.0f}%), below {counts['lost']}; pruned before its warmup "
          f"{counts['pruned before its warmup']} ({100 * counts['pruned before its warmup'] / n:.0f}%)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
