"""Lossless verification of draft trees: one rule for greedy and sampled rows.

At a node, its children are tried in tree order: child ``c_i`` is accepted with probability
``p(c_i) / (1 - sum_{j<i} p(c_j))`` — the target probability left after the earlier siblings were
rejected — and on reaching a node none of whose children is accepted, the bonus token is drawn from
``p`` with every child zeroed and renormalised. Each child is then emitted with probability ``p(c_i)``
and every other token in proportion to ``p``: the target distribution exactly (drafts are
deterministic, so this is the multi-candidate rejection rule with point-mass proposals). For greedy
rows ``p`` is one-hot on the argmax, which makes the rule "longest path matching the argmax".

Every node gets its own counter-based uniform (seed, cycle position, node index), so all decisions
are made at once with tensor ops and the walk is read off the result.
"""

from __future__ import annotations

import torch

from gambit.engine import cpu_filter, cpu_sampler
from gambit.engine.sampler import mix64

_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
_STREAM = 0x5EC  # separates these uniforms from the sampler's


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    return (x >> s) & ((1 << (64 - s)) - 1)


def spec_uniforms(seeds: torch.Tensor, counters: torch.Tensor, n: int) -> torch.Tensor:
    """[S, n] uniforms in (0, 1), a pure function of (seed, counter, column)."""
    h = mix64(mix64(seeds * _GOLDEN + _STREAM) + counters)
    x = mix64(h[:, None] + torch.arange(1, n + 1, device=seeds.device)[None, :] * _GOLDEN)
    u = _srl(x, 11).to(torch.float64) * (1.0 / (1 << 53))
    return u.clamp(1e-15, 1 - 1e-15)


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    """logits [S, N, V] → the distribution plain decoding samples from (one-hot argmax at T = 0, and
    where the scaled logits are no distribution: a tiny temperature overflowed them to +inf, NaN or
    all -inf; the sampler takes the argmax there, and a NaN softmax here emitted token 0 every step)."""
    S, N, V = logits.shape
    flat = logits.float().reshape(S * N, V)
    rep = lambda x: x.repeat_interleave(N)  # noqa: E731
    greedy = rep(temperature == 0)
    hot = flat / torch.where(greedy, 1.0, rep(temperature))[:, None]
    kept = cpu_filter.filter_logits(hot, rep(top_k), rep(top_p))  # the sampler's filter
    greedy = greedy | ~kept.amax(-1).isfinite()  # ``sampler.sample``'s rule for such rows
    p = kept.softmax(-1)
    one = torch.nn.functional.one_hot(cpu_sampler.argmax(flat), V).to(p.dtype)
    return torch.where(greedy[:, None], one, p).view(S, N, V)


def accept(tokens: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor,
           mask: torch.Tensor, probs: torch.Tensor, u: torch.Tensor, residual: bool = True
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk each tree. Index 0 is the root (parent 0, depth 0, valid).

    tokens/parent/depth/valid [S, T]; mask [S, T, T] ancestors-and-self; probs [S, T, V] the target
    distribution at each node; u [S, T + 1] uniforms (column T draws the bonus).
    Returns (on_path [S, T] bool incl. the root, end [S] deepest accepted node, bonus [S]).
    ``residual=False`` draws the bonus from the full distribution — a biased rule that exists only so
    the tests can show that their statistics catch it.
    """
    S, T = tokens.shape
    node = valid.clone()
    node[:, 0] = False
    pc = probs.gather(1, parent[..., None].expand(S, T, probs.shape[-1])).gather(2, tokens[..., None])
    pc = pc.squeeze(-1).double() * node  # p_parent(token) per node
    ar = torch.arange(T, device=tokens.device)
    before = (parent[:, :, None] == parent[:, None, :]) & (ar[None, :] < ar[:, None])[None] & node[:, None, :]
    mass = (before.double() * pc[:, None, :]).sum(-1)
    cond = pc / (1 - mass).clamp(min=1e-30)
    a = node & (u[:, :T] < cond)
    b = a & ~(before & a[:, None, :]).any(-1)
    blocked = mask & ~b[:, None, :]
    blocked[:, :, 0] = False
    on_path = ~blocked.any(-1)
    on_path &= valid
    end = (depth * on_path).argmax(-1)
    # bonus: the end node's distribution with its children (all tried, all rejected) removed
    p_end = probs.gather(1, end[:, None, None].expand(S, 1, probs.shape[-1])).squeeze(1).double()
    child = node & (parent == end[:, None])
    hit = torch.zeros_like(p_end).scatter_add_(1, tokens, child.double()) > 0
    q = p_end.masked_fill(hit, 0.0) if residual else p_end
    c = q.cumsum(-1)
    x = u[:, T] * c[:, -1]
    bonus = torch.searchsorted(c, x[:, None]).squeeze(-1).clamp(max=q.shape[-1] - 1)
    bonus = torch.where(c[:, -1] > 0, bonus, p_end.argmax(-1))  # rounding left no mass: argmax
    return on_path, end, bonus


def greedy_accept(tokens: torch.Tensor, parent: torch.Tensor, depth: torch.Tensor, valid: torch.Tensor,
                  mask: torch.Tensor, logits: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``accept`` for rows that all decode greedily, in a handful of ops (the common serving case).

    With one-hot ``p`` a child is accepted iff its token is the argmax at its parent (siblings are
    distinct, so at most one is), a node is on the path iff it and its ancestors are, and the bonus
    is the argmax at the deepest one. logits [S, T, V]; the rest as in ``accept``.
    """
    am = cpu_sampler.argmax(logits)  # [S, T]; ATen's argmax but for float32 on the CPU (the same indices)
    ok = (tokens == am.gather(1, parent)) & valid
    ok[:, 0] = True
    on_path = ~(mask & ~ok[:, None, :]).any(-1)
    end = (depth * on_path).argmax(-1)
    return on_path, end, am.gather(1, end[:, None]).squeeze(1)


def greedy_paths(tokens: list, parent: list, depth: list, valid: list, argmax: list, width: int
                 ) -> tuple[list[list[int]], list[int], list[int]]:
    """``greedy_accept`` over Python lists, with the path read off (a tree of a few dozen nodes: one
    pass in Python costs less than the ~15 small tensor ops).

    tokens/argmax [S][B+1] (index 0: the root); parent/depth/valid [S][B] for nodes 1..B (parents
    precede their children). Returns (path [S][width]: the tree index at each depth along the accepted
    path, 0 past its end; accepted draft tokens per sequence; bonus token per sequence).
    """
    paths, n_acc, bonus = [], [], []
    for tok, par, dep, val, am in zip(tokens, parent, depth, valid, argmax, strict=True):
        on = [True] + [False] * len(par)
        end = end_depth = 0
        for i, (pa, d, v) in enumerate(zip(par, dep, val, strict=True), 1):
            if v and on[pa] and tok[i] == am[pa]:  # accepted, and so are its ancestors
                on[i] = True
                if d > end_depth:  # the first deepest, as argmax picks
                    end, end_depth = i, d
        path = [0] * width
        i = end
        while i:
            path[dep[i - 1]] = i
            i = par[i - 1]
        paths.append(path)
        n_acc.append(end_depth)
        bonus.append(am[end])
    return paths, n_acc, bonus
