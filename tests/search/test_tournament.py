"""The round decision on hand-made tree views: Case 1, Case 2, ghosts, warmup, floor."""

from __future__ import annotations

import pytest

from gambit.search.tournament import plan_round
from gambit.search.tree import FINISHED, GHOST, RUNNING, Node


def node(i, score=None, own=100, state=RUNNING, birth_depth=0):
    n = Node(i, None, 0, birth_depth, 0.8, state=state, tokens=[0] * (birth_depth + own))
    if score is not None:
        n.scores = [score]
    return n


def test_case2_prunes_bottom_k_and_branches_top_k():
    nodes = [node(i, s) for i, s in enumerate([0.9, 0.1, 0.5, 0.7, 0.3, 0.2])]
    plan = plan_round(nodes, capacity=6, swap=2, warmup=10)
    assert plan.case == 2
    assert plan.prune == [1, 5]  # 0.1, 0.2
    assert plan.branch == [0, 3]  # 0.9, 0.7
    assert len(plan.prune) == len(plan.branch)  # zero-sum


def test_swap_zero_swaps_nothing_but_the_floor_still_prunes():
    nodes = [node(i, s) for i, s in enumerate([0.9, 0.1, 0.5, 0.7, 0.3, 0.05])]
    assert plan_round(nodes, capacity=6, swap=0, warmup=10).case == 0
    plan = plan_round(nodes, capacity=6, swap=0, warmup=10, floor=0.08)
    assert plan.case == 2 and plan.prune == [5] and plan.branch == [0]  # below δ, replaced (zero-sum)
    assert plan_round(nodes[:4], capacity=6, swap=0, warmup=10).branch == [0, 3]  # Case 1 fills


def test_case1_fills_from_top_eligible_only():
    nodes = [node(0, 0.9, own=5), node(1, 0.6), node(2, 0.8), node(3, None), node(4, 0.4, state=FINISHED)]
    plan = plan_round(nodes, capacity=8, swap=2, warmup=10)
    # active = 4 (finished is not), 4 free slots, eligible: 2 (0.8) and 1 (0.6); 0 too young, 3 unscored
    assert plan.case == 1 and plan.prune == [] and plan.branch == [2, 1]


def test_ghosts_count_toward_capacity_and_never_cause_case1():
    nodes = [node(0, 0.9), node(1, 0.8), node(2, 0.2, state=GHOST), node(3, 0.6, state=GHOST)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10)
    assert plan.case == 2 and plan.prune == [2] and plan.branch == [0]
    # the same pool without ghosts in the tree view would have been a Case-1 fill of two
    assert plan_round(nodes[:2], capacity=4, swap=1, warmup=10).case == 1


def test_ghosts_are_never_parents_and_unscored_ghosts_are_pruned_first():
    nodes = [node(0, 0.95, state=GHOST), node(1, 0.5), node(2, None, state=GHOST), node(3, 0.4)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10)
    assert plan.prune == [2] and plan.branch == [1]


def test_warmup_blocks_branching_and_young_children():
    nodes = [node(i, 0.5 + i / 10, own=9) for i in range(4)]
    assert plan_round(nodes, capacity=4, swap=2, warmup=10).case == 0
    assert plan_round(nodes, capacity=8, swap=2, warmup=10).case == 0
    # a child inherits depth but its clock restarts at birth
    child = node(9, 0.99, own=3, birth_depth=200)
    plan = plan_round(nodes[:3] + [child], capacity=4, swap=1, warmup=5)
    assert 9 not in plan.branch and plan.branch == [2]


def test_no_overlap_and_floor():
    nodes = [node(0, 0.05), node(1, 0.06), node(2, 0.07), node(3, 0.9)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10, floor=0.1)
    # three are below the floor but only one parent is left once they go: prune 1, branch 1
    assert plan.case == 2 and plan.prune == [0] and plan.branch == [3]
    nodes = [node(i, s) for i, s in enumerate([0.05, 0.5, 0.6, 0.9, 0.8, 0.7])]
    plan = plan_round(nodes, capacity=6, swap=1, warmup=10, floor=0.55)
    assert plan.prune == [0, 1] and plan.branch == [3, 4]


@pytest.mark.parametrize("capacity,swap", [(4, 1), (8, 3), (16, 4), (5, 5)])
def test_zero_sum_on_random_pools(capacity, swap):
    import random

    rng = random.Random(capacity * 31 + swap)
    for _ in range(200):
        nodes = [node(i, rng.random() if rng.random() < 0.8 else None, own=rng.randint(0, 30),
                      state=GHOST if rng.random() < 0.2 else RUNNING) for i in range(capacity)]
        plan = plan_round(nodes, capacity, swap, warmup=10)
        assert len(plan.prune) == len(plan.branch) <= swap
        assert not set(plan.prune) & set(plan.branch)
        assert all(nodes[p].state == RUNNING and nodes[p].own_tokens >= 10 for p in plan.branch)
        # every pair gains: the parent scores above the trace it replaces, or that one was a ghost
        score = {n.id: n.rank_score() for n in nodes}
        pairs = zip(plan.prune, plan.branch, strict=True)
        assert all(score[b] > score[p] or nodes[p].state == GHOST for p, b in pairs)


def test_floor_without_refill_prunes_below_and_shrinks_the_pool():
    nodes = [node(i, s) for i, s in enumerate([0.9, 0.05, 0.5, 0.7, 0.02, 0.6])]
    plan = plan_round(nodes, capacity=6, swap=1, warmup=10, floor=0.1, floor_refill=False)
    # 1 and 4 fall below the floor: pruned, slots given up; the rest (4 traces, pool 4) swap K=1
    assert plan.shrink == 2 and plan.prune == [1, 4, 2] and plan.branch == [0]
    refill = plan_round(nodes, capacity=6, swap=1, warmup=10, floor=0.1)
    assert refill.shrink == 0 and sorted(refill.prune) == [1, 4] and refill.branch == [0, 3]


def test_rank_by_last_score():
    a, b = node(0), node(1)
    a.scores, b.scores = [0.9, 0.9, 0.1], [0.5, 0.5, 0.6]  # a: mean 0.63 but its last thought failed
    assert plan_round([a, b], capacity=2, swap=1, warmup=10).prune == [1]
    assert plan_round([a, b], capacity=2, swap=1, warmup=10, rank="last").prune == [0]
    assert a.rank_score("min") == 0.1 and b.rank_score("last") == 0.6


def test_a_swap_must_gain_a_tie_is_no_swap():
    # traces that wrote the same thoughts score the same: pruning one for a copy of another gains nothing
    tied = [node(i, 0.86) for i in range(4)]
    assert plan_round(tied, capacity=4, swap=2, warmup=10).case == 0
    assert plan_round(tied, capacity=4, swap=2, warmup=10, swap_ties=True).prune == [3, 2]  # stop 60's rule
    # a child inherits its parent's scores: it is not pruned (youngest first among equals) for a child of
    # a trace that only ties it
    nodes = [node(0, 0.9), node(1, 0.9), node(2, 0.3), node(3, 0.9, own=4, birth_depth=100)]
    nodes[3].parent = 0
    assert plan_round(nodes, capacity=4, swap=2, warmup=10, swap_ties=True).prune == [2, 3]
    plan = plan_round(nodes, capacity=4, swap=2, warmup=10)
    assert plan.prune == [2] and plan.branch == [0]  # only the pair that gains: K is an upper bound
    # a ghost holds no KV: it goes for a resident child even at a tie
    plan = plan_round([node(0, 0.5), node(1, 0.5, state=GHOST)], capacity=2, swap=1, warmup=10)
    assert plan.prune == [1] and plan.branch == [0]


def test_every_trace_below_the_floor_is_pruned_though_unscored_ghosts_rank_under_it():
    # an unscored ghost (evicted before warmup) ranks 0, under a trace scored below δ; K = 1 pruned only
    # the ghost and left the below-δ trace running though a parent at or above δ was free for its slot
    nodes = [node(0, None, state=GHOST), node(1, 0.05), node(2, 0.5), node(3, 0.9)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10, floor=0.1)
    assert plan.case == 2 and plan.prune == [0, 1] and plan.branch == [3, 2]
    # too few parents for both: the rank decides (the ghost, ranked 0, first), as before
    nodes = [node(0, None, state=GHOST), node(1, 0.05), node(2, 0.5, own=4), node(3, 0.9)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10, floor=0.1)
    assert plan.prune == [0] and plan.branch == [3]
    # without a floor nothing changes: the bottom K, the ghost first
    assert plan_round(nodes, capacity=4, swap=1, warmup=10).prune == [0]


def test_a_ghost_is_pruned_before_a_resident_trace_of_the_same_score():
    # equal scores at the bottom: the ghost holds no KV and never resumes, the resident trace would lose
    # its KV and the tokens it has still to write (the younger-first rule alone pruned the resident one)
    nodes = [node(0, 0.9), node(1, 0.5, state=GHOST), node(2, 0.5), node(3, 0.7)]
    plan = plan_round(nodes, capacity=4, swap=1, warmup=10)
    assert plan.prune == [1] and plan.branch == [0]
    assert plan_round(nodes, capacity=4, swap=2, warmup=10).prune == [1, 2]
    # among residents (or among ghosts) of one score, the younger still goes first
    nodes[1].state = RUNNING
    assert plan_round(nodes, capacity=4, swap=1, warmup=10).prune == [2]
