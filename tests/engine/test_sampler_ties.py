"""Tied logits rank by ascending token id on every sampling path, and the Python filter (a ``topk`` prefix
with the ties at its cut fixed up) gives the full stable sort's logits exactly: ties at the cut, NaN / +-inf
rows, +-0, top_p = 1, top_k past the vocabulary, rows of different settings, nuclei past the first prefix."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_filter, cpu_sample_step, cpu_sampler
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch, filter_logits, sample


def _sorted_filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The definition: a full stable descending sort of each row (the filter before Stop 68)."""
    V = logits.shape[-1]
    if not bool(((top_k > 0) & (top_k < V)).any() | (top_p < 1).any()):
        return logits
    order = logits.sort(dim=-1, descending=True, stable=True)[1]

    def to_vocab(by_rank):
        return torch.zeros_like(by_rank).scatter(1, order, by_rank)

    k = torch.where(top_k > 0, top_k.clamp(max=V), V)
    outside = torch.arange(V)[None, :] >= k[:, None]
    probs = logits.masked_fill(to_vocab(outside), float("-inf")).softmax(-1).gather(1, order)
    beyond = ((probs.cumsum(-1) - probs) > top_p[:, None]) & (top_p < 1)[:, None]
    outside |= beyond.cumsum(-1) > 0
    outside[:, 0] = False
    return logits.masked_fill(to_vocab(outside), float("-inf"))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))


def _rows(V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, V, generator=g) * (0.3 + 6 * torch.rand(12, 1, generator=g))
    x[1] = x[1].round()  # ties at every edge
    x[2] = x[2].bfloat16().float()
    x[3, : V // 3] *= 12  # peaked
    x[4] = 0.001 * x[4]  # flat: the nucleus runs past the first prefix
    x[5, ::7] = float("-inf")
    x[6] = float("-inf")
    x[6, V // 2] = 1.0 if seed % 2 else float("-inf")
    x[7, V // 3] = float("nan")
    x[8, min(2, V - 1)] = float("inf")
    x[9] = 0.0  # one tie across the row
    x[10, 1::2] = -0.0
    x[10, ::2] = 0.0
    return x


@pytest.mark.parametrize("V", [1, 2, 7, 300, 1024, 1025, 1500, 5003])
def test_the_prefix_filter_equals_the_full_sort(V):
    for seed in range(3):
        x = _rows(V, seed)
        g = torch.Generator().manual_seed(seed)
        cases = [
            (torch.randint(0, V + 3, (12,), generator=g), torch.ones(12)),  # k up to past V
            (torch.zeros(12, dtype=torch.long), torch.rand(12, generator=g)),
            (torch.randint(0, V + 3, (12,), generator=g), torch.rand(12, generator=g)),
            (torch.zeros(12, dtype=torch.long), torch.full((12,), 0.999)),  # most of the row
            (torch.tensor([0, 1, V, V + 5, 2, 0, 3, 1, 0, 4, 2, 0]), torch.tensor(
                [1.0, 0.5, 0.9, 1.0, 1e-6, 0.99, 1.0, 0.3, 0.7, 1.0, 0.95, 0.5])),
        ]
        for top_k, top_p in cases:
            got = filter_logits(x.clone(), top_k, top_p)
            assert _same(got, _sorted_filter(x, top_k, top_p)), (V, seed, top_k, top_p)


@pytest.mark.parametrize("V", [8, 3000])
def test_ties_at_the_top_k_cut_keep_the_lowest_ids(V):
    x = torch.full((1, V), -5.0)
    x[0, [1, 3, 4, 5, 7, V - 1]] = 2.0
    got = filter_logits(x, torch.tensor([3]), torch.tensor([1.0]))
    assert (got[0] > float("-inf")).nonzero().flatten().tolist() == [1, 3, 4]


def _tied(V: int) -> torch.Tensor:
    """Rows whose largest value is shared by ids 5, 40, 41 and 250 (and a runner-up tie further down)."""
    x = torch.linspace(-3, -1, V).flip(0).repeat(4, 1)
    x[:, [5, 40, 41, 250]] = 4.0
    x[:, [7, 9]] = 3.0
    return x


def _draws(sampler, x, top_k, top_p, temp=1.0, n=64):
    """The tokens drawn over n counters by one sampling path."""
    B = x.shape[0]
    seen = set()
    for c in range(n):
        batch = SamplingBatch.build([temp] * B, [top_k] * B, [top_p] * B, list(range(B)), [c] * B, "cpu")
        seen.update(sampler(x, batch).tolist())
    return seen


def _step(x, batch):
    k = cpu_sample_step.step_kernel(torch.device("cpu"), x.shape[1])
    if k is None:
        pytest.skip("the plain-loop step does not serve here")
    tok = k(x, batch.temperature.tolist(), batch.seeds.tolist(), batch.counters.tolist(), 0, 0, CDF_BLOCK,
            batch.top_k.tolist(), batch.top_p.tolist())[0]
    return torch.tensor(tok)


def _compiled(x, batch):
    if not cpu_sampler.available(x.device):
        pytest.skip("no C++ kernels")
    return cpu_sampler.sample(x, batch)


PATHS = {"python": sample, "compiled": _compiled, "step": _step}


@pytest.mark.parametrize("V", [300, 3000])
@pytest.mark.parametrize("path", PATHS)
def test_every_path_breaks_ties_by_ascending_id(path, V):
    x, draw = _tied(V), PATHS[path]
    assert _draws(draw, x, 0, 1.0, temp=0.0, n=2) == {5}  # greedy: the first of the tied maxima
    assert _draws(draw, x, 1, 1.0, temp=5.0) == {5}  # top-1: the lowest tied id, at any temperature
    assert _draws(draw, x, 2, 1.0, temp=5.0) == {5, 40}  # top-2 cuts inside the tie
    assert _draws(draw, x, 6, 1.0, temp=5.0) == {5, 40, 41, 250, 7, 9}  # the runner-up tie kept whole
    assert _draws(draw, x, 5, 1.0, temp=5.0) == {5, 40, 41, 250, 7}  # ... and cut at its lowest id
    # top-p: each tied maximum holds ~1/4 of the mass (T = 0.1), so 0.3 keeps two of them, 0.6 three
    assert _draws(draw, x, 0, 0.3, temp=0.1) == {5, 40}
    assert _draws(draw, x, 0, 0.6, temp=0.1) == {5, 40, 41}


def test_the_compiled_filter_breaks_ties_as_the_python_one():
    if not cpu_filter.available():
        pytest.skip("no C++ kernels")
    x = _tied(3000)
    for probe in (True, False):
        for k, p in [(2, 1.0), (5, 1.0), (0, 0.3), (3, 0.6), (0, 1e-6)]:
            top_k, top_p = torch.full((4,), k), torch.full((4,), p)
            got = cpu_filter.filter_logits(x / 0.1, top_k, top_p, probe=probe)
            assert _same(got, _sorted_filter(x / 0.1, top_k, top_p)), (probe, k, p)
