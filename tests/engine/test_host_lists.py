"""``host_lists`` builds the tensors ``torch.tensor`` would (values, dtype, shape, writable memory)."""

from __future__ import annotations

import torch

from gambit.engine.host_lists import long_tensor, padded_rows


def test_long_tensor_equals_torch_tensor():
    for values in ([], [0], [5, -3, 2**62, -(2**63)], list(range(1000))):
        got, want = long_tensor(values), torch.tensor(values, dtype=torch.long)
        assert got.dtype == torch.long and got.shape == want.shape and torch.equal(got, want)
    t = long_tensor([1, 2, 3])
    t += 1  # writable, and its own memory from here on
    assert t.tolist() == [2, 3, 4]


def test_padded_rows_cuts_and_pads():
    rows = [[3, 1, 4], [], [1, 5, 9, 2, 6], [5]]
    for width in (0, 1, 3, 7):
        want = torch.tensor([(r + [0] * width)[:width] for r in rows], dtype=torch.long)
        want = want.view(len(rows), width)
        got = padded_rows(rows, width)
        assert got.dtype == torch.long and torch.equal(got, want), width
    assert padded_rows([], 4).shape == (0, 4)
