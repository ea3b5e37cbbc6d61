"""The log-probability kernels of the sampling step (``cpu_logprobs``): each row's maximum and log-sum
give ``torch.log_softmax`` exactly, and the compiled top-k gives ``sampler.top_entries``' entries (a stable
descending sort's first k: ties by ascending id, NaNs first), ties and NaNs included."""

from __future__ import annotations

import pytest
import torch
from engine_util import tied_row

from gambit.engine import cpu_attention
from gambit.engine.sampler import top_entries

kernel = cpu_attention.kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="the CPU kernels do not build here")


def _ref(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    v, i = x.sort(dim=-1, descending=True, stable=True)
    return v[:, :k], i[:, :k]


@needs_kernel
@pytest.mark.parametrize("V", [100, 1280, 4099, 49152])
@pytest.mark.parametrize("k", [2, 5, 20])
def test_topk_rows_orders_ties_by_id_among_nans(V, k):
    """The compiled heap gives the first k of a stable descending sort, values and indices, and the
    Python path (``top_entries``) the same: ties by ascending id (integers; bfloat16-rounded
    log-probabilities), NaNs first, rows of -inf, an inf; at the shipped target's 100 entries too."""
    topk_rows = kernel.topk_rows
    g = torch.Generator().manual_seed(V + k)
    for kind in ("normal", "ties", "bf16"):
        x = torch.randn(19, V, generator=g)
        if kind == "ties":
            x = torch.randint(-4, 4, (19, V), generator=g).float()
        elif kind == "bf16":
            x = torch.log_softmax(x.bfloat16().float(), -1)
        x[3, 10] = x[3, V - 1] = float("nan")
        x[4, :] = float("-inf")
        x[5, 7] = float("inf")
        x[6, :] = float("nan")
        v, i = topk_rows(x, k)
        assert v.numel() > 0, "the compiled top-k must serve for 2 <= k <= V"
        want_v, want_i = _ref(x, k)
        assert torch.equal(i, want_i), (V, k, kind)
        assert torch.equal(v.nan_to_num(), want_v.nan_to_num()) and torch.equal(v.isnan(), want_v.isnan())
        pv, pi = top_entries(x, k)
        assert torch.equal(pi, want_i), (V, k, kind)
        assert torch.equal(pv.nan_to_num(), want_v.nan_to_num()) and torch.equal(pv.isnan(), want_v.isnan())


@needs_kernel
@pytest.mark.parametrize("V", [100, 49152])
def test_topk_rows_top_n_is_a_prefix_whatever_k(V):
    """A row's top 5 is the first 5 of its top 20 (what lets a batch ask for its largest ``logprobs``),
    the tie at the cut going to the lower id, on the compiled path and the Python one."""
    x = torch.stack([tied_row(V), torch.log_softmax(tied_row(V), -1)])
    for top in (kernel.topk_rows, top_entries):
        ids = {k: top(x, k)[1] for k in (5, 6, 20)}
        assert torch.equal(ids[5], ids[20][:, :5]) and torch.equal(ids[6], ids[20][:, :6])
        assert ids[5][:, 4].tolist() == [29, 29] and ids[6][:, 5].tolist() == [84, 84]


@needs_kernel
def test_topk_rows_declines_outside_two_to_v():
    for k in (1, 101):
        v, i = kernel.topk_rows(torch.randn(4, 100), k)
        assert v.numel() == 0 and i.numel() == 0


@needs_kernel
@pytest.mark.parametrize("V", [16, 17, 100, 4099, 49152])
def test_row_log_softmax_is_atens(V):
    """A row's maximum m and log-sum s as the step computes them give ``torch.log_softmax`` exactly, entry
    for entry, as (x - m) - s: what lets the step return log-probabilities without a [B, V] block. On a
    host whose ATen kernels are AVX-512 (its exp, log and reduction order are what is reproduced) this
    path must serve."""
    rows = kernel.log_softmax_rows
    g = torch.Generator().manual_seed(V)
    x = torch.cat([torch.randn(4, V, generator=g) * scale for scale in (0.01, 1.0, 8.0, 60.0)])
    x[1, :] = torch.randint(-3, 3, (V,), generator=g).float()  # ties
    x[2, V // 3] = float("-inf")
    x[3, :] += 1e4  # large, close together
    x[5, V - 1] = 90.0  # the maximum in the tail
    m, s = rows(x)
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert m.numel() == x.shape[0], "the row log-softmax must serve where ATen runs AVX-512 kernels"
    if m.numel() == 0:
        pytest.skip("not reproduced on this host's ATen kernels: the step keeps ATen's log_softmax")
    assert torch.equal((x - m[:, None]) - s[:, None], torch.log_softmax(x, -1))
