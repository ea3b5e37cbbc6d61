"""The rejection rule's output distribution, computed exactly: every decision of ``verify.accept`` is a
threshold on one uniform, so on a tree whose thresholds are multiples of 1/K the midpoints of a K-cell
grid per uniform weigh every outcome exactly. The emitted sequences must then have the target's joint
probability to the last count (the chi-square tests in test_verify.py only bound it)."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction as Fr

import torch

from gambit.speculative.verify import accept

# root 0; A (1, token 0) and B (2, token 1) under it; C (3, token 2) under A; D (4, token 2) under the
# root but invalid (never tried, never removed from the bonus's distribution)
TOKENS = [0, 0, 1, 2, 2]
PARENT = [0, 0, 0, 1, 0]
DEPTH = [0, 1, 1, 2, 1]
VALID = [True, True, True, True, False]
P = {0: [Fr(1, 2), Fr(1, 4), Fr(1, 4)],  # the target at each node (root, A, B, C, D)
     1: [Fr(1, 3), Fr(1, 3), Fr(1, 3)],
     2: [Fr(1, 6), Fr(1, 2), Fr(1, 3)],
     3: [Fr(1, 4), Fr(1, 4), Fr(1, 2)],
     4: [Fr(1, 1), Fr(0), Fr(0)]}
K = 12  # every threshold (1/2, 1/3, 1/6, 2/3, 1/4 and the residual CDFs) is a multiple of 1/12
GRID = [1, 2, 3, 5]  # u columns that decide something: A, B, C and the bonus (column T)


def _mask() -> torch.Tensor:
    T = len(TOKENS)
    m = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        j = i
        while j:
            j = PARENT[j]
            m[i, j] = True
    return m


def _emitted(residual: bool) -> Counter:
    """Emitted sequence (path tokens, then the bonus) -> grid cells that emit it."""
    T, V = len(TOKENS), 3
    cells = torch.tensor(list(itertools.product(range(K), repeat=len(GRID))), dtype=torch.float64)
    n = cells.shape[0]
    u = torch.full((n, T + 1), 0.5, dtype=torch.float64)
    u[:, GRID] = (cells + 0.5) / K
    rep = lambda x: torch.tensor(x).expand(n, T).clone()  # noqa: E731
    probs = torch.tensor([[float(x) for x in P[i]] for i in range(T)], dtype=torch.float64)
    on_path, end, bonus = accept(rep(TOKENS), rep(PARENT), rep(DEPTH), rep(VALID), _mask().expand(n, T, T),
                                 probs.expand(n, T, V), u, residual=residual)
    assert not bool(on_path[:, 4].any())  # the invalid node is never on a path
    seqs = Counter()
    for path, b in zip(on_path.tolist(), bonus.tolist(), strict=True):
        nodes = sorted((DEPTH[i], i) for i in range(1, T) if path[i])
        seqs[(*(TOKENS[i] for _, i in nodes), b)] += 1
    return seqs


def _target() -> dict[tuple, Fr]:
    """The target's own joint distribution of the sequences the tree can emit in one cycle."""
    out = {}
    for x, px in enumerate(P[0]):
        node = {0: 1, 1: 2}.get(x)  # the draft node that token x reaches (token 2: none valid)
        if node is None:
            out[(x,)] = px
            continue
        for y, py in enumerate(P[node]):
            if node == 1 and y == 2:  # C: one level deeper
                for z, pz in enumerate(P[3]):
                    out[(x, y, z)] = px * py * pz
            else:
                out[(x, y)] = px * py
    return {k: v for k, v in out.items() if v}


def test_rejection_rule_emits_the_target_distribution_exactly():
    seqs = _emitted(residual=True)
    total = K ** len(GRID)
    assert {k: Fr(v, total) for k, v in seqs.items()} == _target()


def test_a_biased_bonus_is_off_by_an_exact_amount():
    """Drawing the bonus without removing the rejected children: after A, token 2 (C's, rejected) is
    drawn again: (0, 2) ends a cycle with probability 1/2 x 2/3 x 1/3 = 1/9 where the target has 0."""
    seqs = _emitted(residual=False)
    got = {k: Fr(v, K ** len(GRID)) for k, v in seqs.items()}
    assert got != _target() and got[(0, 2)] == Fr(1, 9)
