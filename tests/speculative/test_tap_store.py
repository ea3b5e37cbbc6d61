"""``tap_store.write_rows``: the C++ row copy writes the bytes ATen's ``cat`` + ``index_copy_`` write,
for every row or some, in float32 and bfloat16, and refuses shapes that do not fit."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_attention
from gambit.speculative.tap_store import write_rows


def _aten(buf, slots, rows, taps):
    if rows is None:
        buf.index_copy_(0, slots, torch.cat(taps, dim=-1))
    else:
        r = torch.tensor(rows)
        buf.index_copy_(0, slots[r], torch.cat([t[r] for t in taps], dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [0, 3, 4, 9], [7]])
def test_same_bytes_as_aten(dtype, rows):
    if cpu_attention.kernel() is None:
        pytest.skip("the CPU kernels do not build here")
    g = torch.Generator().manual_seed(3)
    taps = [torch.randn(10, 24, generator=g).to(dtype) for _ in range(3)]
    slots = torch.randperm(64, generator=g)[:10]
    want = torch.full((64, 72), -7.0, dtype=dtype)
    got = want.clone()
    _aten(want, slots, rows, taps)
    write_rows(got, slots, rows, taps)
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    untouched = torch.ones(64, dtype=torch.bool)
    untouched[slots if rows is None else slots[torch.tensor(rows)]] = False
    assert bool((got[untouched] == -7.0).all())  # other slots keep what they held


def test_no_rows_writes_nothing():
    buf = torch.zeros(8, 6)
    write_rows(buf, torch.arange(2), [], [torch.ones(2, 3), torch.ones(2, 3)])
    assert not buf.any()


def test_refuses_what_does_not_fit():
    if cpu_attention.kernel() is None:
        pytest.skip("the CPU kernels do not build here")
    k = cpu_attention.kernel()
    buf, slots, every = torch.zeros(8, 6), torch.arange(2), torch.empty(0, dtype=torch.long)
    with pytest.raises(RuntimeError, match="wide"):
        k.rows_to_slots(buf, slots, every, [torch.ones(2, 3)])  # 3 of 6 columns
    with pytest.raises(RuntimeError, match="slot 9"):
        k.rows_to_slots(buf, torch.tensor([0, 9]), every, [torch.ones(2, 3), torch.ones(2, 3)])
    with pytest.raises(RuntimeError, match="dtype"):
        k.rows_to_slots(buf, slots, every, [torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3)])
