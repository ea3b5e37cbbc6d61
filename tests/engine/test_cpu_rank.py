"""A row's ranking as items (``cpu_rank``): the radix sort is ATen's stable descending sort exactly."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_attention

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="no C++ kernels")


@pytest.mark.parametrize("V", [1, 2, 100, 4099, 49152])
def test_radix_sort_is_atens_stable_descending_sort(V):
    """The filter's sort (``sort_desc_rows``): ATen's ``sort(descending=True, stable=True)`` exactly, values
    and indices: NaNs first, tied values (+0 and -0 among them) in index order, +-inf, denormals."""
    g = torch.Generator().manual_seed(V)
    for kind in ("normal", "ties", "bf16", "special"):
        x = torch.randn(9, V, generator=g)
        if kind == "ties":
            x = torch.randint(-4, 4, (9, V), generator=g).float()
        elif kind == "bf16":
            x = x.bfloat16().float()
        elif kind == "special":
            x[:, ::3] = 0.0
            x[:, 1::5] = -0.0
            x[:, ::7] = float("nan")
            x[:, ::11] = float("inf")
            x[:, ::13] = float("-inf")
            x[:, 2::17] = 1e-41
        v, i = cpu_attention.kernel().sort_desc_rows(x)
        want_v, want_i = x.sort(dim=-1, descending=True, stable=True)
        assert torch.equal(i, want_i), (V, kind)
        assert torch.equal(v.nan_to_num(0.5), want_v.nan_to_num(0.5))
        assert torch.equal(v.signbit(), want_v.signbit())
