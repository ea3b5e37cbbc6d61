"""Verification rule: exact target distribution (and a biased variant the statistics reject)."""

from __future__ import annotations

import torch

from gambit.engine.sampler import filter_logits
from gambit.speculative.verify import (
    accept,
    greedy_accept,
    greedy_paths,
    spec_uniforms,
    target_probs,
)

# root 0 → nodes 1 (token 0), 2 (token 1); node 1 → 3 (token 2), 4 (token 3); node 2 → 5 (token 0)
TOKENS = [4, 0, 1, 2, 3, 0]  # the root token (index 0) is not a candidate
PARENT = [0, 0, 0, 1, 1, 2]
DEPTH = [0, 1, 1, 2, 2, 2]
V = 5
P = torch.tensor([[0.45, 0.25, 0.15, 0.10, 0.05],  # at the root
                  [0.10, 0.20, 0.40, 0.25, 0.05],  # at node 1
                  [0.30, 0.30, 0.20, 0.10, 0.10],  # node 2
                  [0.20, 0.20, 0.20, 0.20, 0.20],
                  [0.60, 0.10, 0.10, 0.10, 0.10],
                  [0.05, 0.05, 0.05, 0.05, 0.80]], dtype=torch.float64)
CHI2_999 = {4: 18.47}  # chi-square 99.9% quantiles


def _mask():
    T = len(TOKENS)
    m = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        j = i
        while j:
            j = PARENT[j]
            m[i, j] = True
    return m


def _run(n: int, residual: bool = True, probs=P):
    T = len(TOKENS)
    rep = lambda x: torch.tensor(x).expand(n, T).clone()  # noqa: E731
    u = spec_uniforms(torch.full((n,), 7), torch.arange(n), T + 1)
    on_path, end, bonus = accept(rep(TOKENS), rep(PARENT), rep(DEPTH), torch.ones(n, T, dtype=torch.bool),
                                 _mask().expand(n, T, T), probs.expand(n, T, V), u, residual=residual)
    # emitted sequence: path tokens (depth order) then the bonus
    first = torch.where(end == 0, bonus, torch.tensor(TOKENS)[torch.where(on_path[:, 1], 1, 2)])
    second = torch.full((n,), -1)
    via1 = on_path[:, 1]
    second = torch.where(via1 & (end == 1), bonus, second)
    second = torch.where(via1 & on_path[:, 3], 2, second)
    second = torch.where(via1 & on_path[:, 4], 3, second)
    return first, second, on_path, end


def _chi2(samples: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=len(p)).double()
    expected = p * len(samples)
    return float(((counts - expected) ** 2 / expected).sum())


def test_emitted_tokens_follow_the_target_distribution():
    n = 40_000
    first, second, on_path, end = _run(n)
    assert _chi2(first, P[0]) < CHI2_999[4]
    after0 = second[(first == 0) & (second >= 0)]
    assert len(after0) > 0.4 * n * 0.45
    assert _chi2(after0, P[1]) < CHI2_999[4]
    assert 0.3 < float((end > 0).double().mean()) < 0.9  # the tree is used, not bypassed
    assert bool((on_path[:, 3] & on_path[:, 4]).any()) is False  # one child per node at most


def test_biased_variant_is_rejected():
    """Drawing the bonus without removing the rejected children over-weights them: caught."""
    n = 40_000
    first, second, _, _ = _run(n, residual=False)
    after0 = second[(first == 0) & (second >= 0)]
    assert _chi2(first, P[0]) > 10 * CHI2_999[4] or _chi2(after0, P[1]) > 10 * CHI2_999[4]


def test_greedy_is_longest_matching_path():
    one = torch.nn.functional.one_hot(torch.tensor([0, 3, 1, 4, 2, 0]), V).double()
    first, second, on_path, end = _run(50, probs=one)
    # argmax at root is 0 (node 1), at node 1 it is 3 (node 4), node 4 is a leaf: bonus = argmax there
    assert bool((end == 4).all()) and bool(on_path[:, [0, 1, 4]].all())
    assert not bool(on_path[:, [2, 3, 5]].any())
    assert bool((first == 0).all()) and bool((second == 3).all())


def test_greedy_fast_path_equals_the_general_rule():
    """``greedy_accept`` on random logits (some trees with invalid nodes) equals ``accept`` with one-hot p."""
    g = torch.Generator().manual_seed(0)
    n, T = 400, len(TOKENS)
    rep = lambda x: torch.tensor(x).expand(n, T).clone()  # noqa: E731
    logits = torch.randn(n, T, V, generator=g) * 0.5
    logits[..., 0] += 0.8  # paths of every length occur
    valid = torch.rand(n, T, generator=g) > 0.1
    valid[:, 0] = True
    args = (rep(TOKENS), rep(PARENT), rep(DEPTH), valid, _mask().expand(n, T, T))
    one = torch.nn.functional.one_hot(logits.argmax(-1), V).double()
    want = accept(*args, one, spec_uniforms(torch.full((n,), 3), torch.arange(n), T + 1))
    got = greedy_accept(*args, logits)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert len(set(want[1].tolist())) >= 4  # several different ends were exercised


def test_greedy_paths_equal_greedy_accept():
    """The list walk (serving's greedy verification) picks greedy_accept's end, bonus and path."""
    g = torch.Generator().manual_seed(1)
    n, T = 400, len(TOKENS)
    rep = lambda x: torch.tensor(x).expand(n, T).clone()  # noqa: E731
    logits = torch.randn(n, T, V, generator=g) * 0.5
    logits[..., 0] += 0.8
    valid = torch.rand(n, T, generator=g) > 0.1
    valid[:, 0] = True
    depth = rep(DEPTH)
    mask = _mask().expand(n, T, T)
    on_path, end, bonus = greedy_accept(rep(TOKENS), rep(PARENT), depth, valid, mask, logits)
    width = max(DEPTH) + 2
    paths, n_acc, got_bonus = greedy_paths(rep(TOKENS).tolist(), rep(PARENT)[:, 1:].tolist(),
                                           depth[:, 1:].tolist(), valid[:, 1:].tolist(),
                                           logits.argmax(-1).tolist(), width)
    assert got_bonus == bonus.tolist() and n_acc == depth.gather(1, end[:, None]).squeeze(1).tolist()
    path = torch.zeros(n, width, dtype=torch.long)  # the tensor construction verification used
    path.scatter_(1, torch.where(on_path, depth, width - 1), torch.arange(T)[None].expand(n, T))
    path[:, width - 1] = 0
    assert paths == path.tolist()
    assert len(set(n_acc)) >= 3


def test_uniforms_are_a_function_of_seed_and_counter():
    a = spec_uniforms(torch.tensor([1, 2, 1]), torch.tensor([5, 5, 5]), 8)
    assert torch.equal(a[0], a[2]) and not torch.equal(a[0], a[1])
    assert float(a.min()) > 0 and float(a.max()) < 1
    big = spec_uniforms(torch.zeros(2000, dtype=torch.long), torch.arange(2000), 4)
    assert abs(float(big.mean()) - 0.5) < 0.02


def test_target_probs_match_plain_sampling_rules():
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0))
    p = target_probs(logits, torch.tensor([0.0, 0.7]), torch.tensor([0, 5]), torch.tensor([1.0, 0.9]))
    assert torch.equal(p[0].argmax(-1), logits[0].argmax(-1)) and bool((p[0].max(-1).values == 1).all())
    assert bool(((p[1] > 0).sum(-1) <= 5).all())
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 3, dtype=p.dtype))
    kept = filter_logits(logits[1] / 0.7, torch.tensor([5] * 3), torch.tensor([0.9] * 3))
    torch.testing.assert_close(p[1], kept.softmax(-1))


def test_target_probs_at_a_temperature_that_overflows_the_logits_is_the_argmax():
    """A temperature so small that logits / T overflow (+inf; softmax NaN) samples the argmax in plain
    decoding (``sampler.sample``); ``target_probs`` gave NaN rows there, and ``accept`` then emitted token
    0 every cycle. Now such rows are one-hot on the argmax, the other rows as before."""
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(1))
    p = target_probs(logits, torch.tensor([1e-39, 0.7]), torch.tensor([0, 0]), torch.tensor([1.0, 1.0]))
    assert not bool(p.isnan().any())
    assert torch.equal(p[0], torch.nn.functional.one_hot(logits[0].argmax(-1), 50).to(p.dtype))
    torch.testing.assert_close(p[1], (logits[1] / 0.7).softmax(-1))
