"""One Gambit round as a pure decision over the tree view: which traces to prune, which to branch.

Case 1 (N < C): branch the top ``min(C - N, |B|)`` eligible traces. Case 2 (N = C): prune the bottom
K and branch the top K (zero-sum). N counts ghosts, so an eviction never causes a Case-1 fill.

A Case-2 pair (the i-th worst pruned, a child of the i-th best) is made only where it gains: the
parent scores above the pruned trace, or the pruned one is a ghost (it never resumes) or below the
floor. A child inherits its parent's scores, so a tied swap prunes a trace for a copy of one no better;
on the shipped task, where many traces write the same first thoughts, most swaps tied and most pruned
traces were children younger than their warmup (``tools/swap_ties.py``). ``swap_ties=True`` keeps the
old rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gambit.search.tree import Node


@dataclass
class RoundPlan:
    case: int  # 0: nothing, 1: fill, 2: swap
    prune: list[int] = field(default_factory=list)
    branch: list[int] = field(default_factory=list)  # parent ids, one child each
    shrink: int = 0  # slots given up (floor prunes without refill): the pool's size drops by this


def _order(nodes: Sequence[Node], reverse: bool, score: dict[int, float]) -> list[Node]:
    # score, then a ghost before a resident trace when worst (pruning it loses no KV and no tokens to
    # come; parents are all resident), then age (older first when best, younger first when worst)
    return sorted(nodes, key=lambda n: (score[n.id], n.resident, -n.id), reverse=reverse)


def eligible(n: Node, warmup: int) -> bool:
    """B: resident, past warmup since its own creation, and scored (ranked)."""
    return n.resident and n.own_tokens >= warmup and bool(n.scores)


def rankable(n: Node) -> bool:
    """May be pruned: it has a score (it passed warmup), or it is a ghost (which never gains one)."""
    return n.active and (bool(n.scores) or not n.resident)


def plan_round(nodes: Sequence[Node], capacity: int, swap: int, warmup: int, floor: float = 0.0,
               rank: str = "mean", floor_refill: bool = True, swap_ties: bool = False) -> RoundPlan:
    """``capacity``: the pool's size now (C, less the slots given up). ``floor_refill=False``: every
    scored trace below the floor is pruned at once and its slot given up (not refilled), then the
    round runs on the rest with the smaller pool. ``swap_ties``: pair the bottom and top K whatever
    their scores (else a pair must gain, see above)."""
    active = [n for n in nodes if n.active]
    score = {n.id: n.rank_score(rank) for n in active}  # once per round: every rule below reads it
    if not floor_refill and floor > 0:
        below = [n for n in active if n.scores and score[n.id] < floor]
        if below:
            gone = {n.id for n in below}
            plan = plan_round([n for n in active if n.id not in gone], capacity - len(below), swap, warmup,
                              floor, rank, True, swap_ties)
            return RoundPlan(plan.case or 2, [n.id for n in below] + plan.prune, plan.branch, len(below))
    # below the hard floor a trace is never a parent
    cands = _order([n for n in active if eligible(n, warmup) and score[n.id] >= floor], True, score)
    if len(active) < capacity:
        take = cands[:capacity - len(active)]
        return RoundPlan(1 if take else 0, [], [n.id for n in take])
    ranked = _order([n for n in active if rankable(n)], False, score)
    below = {n.id for n in ranked if n.scores and score[n.id] < floor}
    # every below-δ trace joins the pruned: unscored ghosts (score 0) rank under them, so count up to
    # the last one, not just how many there are (the ghosts before them are pruned too: pairs that gain)
    want = max([swap] + [i + 1 for i, x in enumerate(ranked) if x.id in below])
    # the pruned and the branched must not overlap: shrink until enough parents remain
    n = min(want, len(ranked))
    while n > 0:
        gone = {x.id for x in ranked[:n]}
        parents = [c for c in cands if c.id not in gone]
        if len(parents) >= n:
            pairs = [(x, p) for x, p in zip(ranked[:n], parents[:n], strict=True)
                     if swap_ties or score[p.id] > score[x.id] or not x.resident or x.id in below]
            if not pairs:
                return RoundPlan(0)
            return RoundPlan(2, [x.id for x, _ in pairs], [p.id for _, p in pairs])
        n -= 1
    return RoundPlan(0)
