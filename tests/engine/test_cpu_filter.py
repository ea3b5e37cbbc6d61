"""The compiled top-k / top-p filter gives ``sampler.filter_logits``'s logits exactly, without ranking whole
rows: short rows (ranked whole), long ones (a threshold, then only the entries above it), ties at every
edge, NaN / +-inf rows, nuclei of one entry and of most of the row, top_p next to 1."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_filter
from gambit.engine.sampler import SamplingBatch, filter_logits, sample

pytestmark = pytest.mark.skipif(not cpu_filter.available(), reason="no C++ kernels")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))


def _rows(V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B = 12
    x = torch.randn(B, V, generator=g) * (0.3 + 6 * torch.rand(B, 1, generator=g))
    x[1] = x[1].round()  # ties everywhere, at every edge
    x[2] = x[2].bfloat16().float()  # bf16 logits: ties among the top
    x[3, : V // 3] *= 12  # peaked: a nucleus of a few entries
    x[4] = 0.01 * x[4]  # flat: a nucleus of most of the row
    x[5, ::7] = float("-inf")
    x[6] = float("-inf")  # nothing possible (softmax NaN: top-p cuts nothing)
    x[6, V // 2] = 1.0 if seed % 2 else float("-inf")
    x[7, V // 3] = float("nan")
    x[8, min(2, V - 1)] = float("inf")
    x[9] = 0.0  # one tie across the row
    x[10, 1::2] = -0.0
    return x


@pytest.mark.parametrize("V", [2, 7, 100, 4096, 4097, 5003, 49152])
def test_same_logits_as_the_python_filter(V):
    g = torch.Generator().manual_seed(V)
    for seed in range(4):
        x = _rows(V, seed)
        B = x.shape[0]
        top_k = torch.randint(0, V + 3, (B,), generator=g) * (torch.rand(B, generator=g) < 0.4)
        top_p = torch.rand(B, generator=g).clamp(min=1e-6)
        top_p[torch.rand(B, generator=g) < 0.25] = 1.0
        top_p[:3] = torch.tensor([0.9999, 0.999999, 0.95])
        before = x.clone()
        got = cpu_filter.filter_logits(x, top_k, top_p, probe=False)  # the plain loops, wherever they run
        assert _same(x, before)  # the input is left alone
        want = filter_logits(x, top_k, top_p)
        assert _same(got, want), (V, seed, (got.isfinite() != want.isfinite()).sum(1).tolist())
        # each setting alone, on every row
        for k, p in ((1, 1.0), (min(5, V), 1.0), (0, 0.5), (0, 0.99), (3, 0.9), (V - 1, 0.999)):
            ks, ps = torch.full((B,), k), torch.full((B,), p)
            got = cpu_filter.filter_logits(x, ks, ps, probe=False)
            assert _same(got, filter_logits(x, ks, ps)), (V, seed, k, p)


def test_nucleus_sizes_from_one_to_most_of_the_row():
    """Top-p 0.95 over rows whose nuclei hold 1 to ~30,000 of 49,152 entries (the threshold search
    narrows a long row to the entries it must rank; each size is a different number of its steps)."""
    V = 49152
    g = torch.Generator().manual_seed(1)
    base = torch.randn(8, V, generator=g)
    x = base * torch.tensor([40.0, 12.0, 6.0, 3.0, 1.5, 1.0, 0.5, 0.1])[:, None]
    ps = torch.full((8,), 0.95)
    got = cpu_filter.filter_logits(x, torch.zeros(8, dtype=torch.long), ps, probe=False)
    want = filter_logits(x, torch.zeros(8, dtype=torch.long), ps)
    assert torch.equal(got, want)
    sizes = got.isfinite().sum(1).tolist()
    assert sizes[0] < 10 and sizes[-1] > 25_000 and sizes == sorted(sizes)


def test_the_nucleus_is_a_prefix_of_the_ranking():
    """What the compiled filter relies on, in the Python filter's own terms: the kept entries are the
    first n of the stable ranking, for top-k, top-p and both."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 3000, generator=g).mul(3).round()  # many ties
    for k, p in ((40, 1.0), (0, 0.7), (100, 0.9)):
        kept = filter_logits(x, torch.full((16,), k), torch.full((16,), p)).isfinite()
        order = x.sort(dim=-1, descending=True, stable=True)[1]
        by_rank = kept.gather(1, order)
        n = by_rank.sum(1, keepdim=True)
        assert torch.equal(by_rank, torch.arange(3000)[None, :] < n)


def test_the_sampler_draws_the_same_tokens_through_it():
    """``cpu_sampler.sample`` filters through this filter (in place on its scaled logits): the Python
    sampler's tokens at a real vocabulary's width, top-k and top-p rows mixed with plain ones."""
    from gambit.engine import cpu_sampler

    B, V = 24, 49152
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(B, V, generator=g) * 4
    top_k = [0, 0, 20, 0, 50, 0] * 4
    top_p = [0.95, 1.0, 1.0, 0.5, 0.9, 0.99] * 4
    sb = SamplingBatch.build([0.7] * B, top_k, top_p, list(range(B)), [3] * B, torch.device("cpu"))
    assert torch.equal(cpu_sampler.sample(logits, sb), sample(logits.clone(), sb))
