"""The scorer's input check on the search's hot path: one reduction, no Python outside scorer.py, and
still every non-finite row refused (a finite sum proves the rows finite; a non-finite one looks again)."""

from __future__ import annotations

import sys

import pytest
import torch

import gambit.scoring.scorer as scorer_module
from gambit.scoring import random_scorer
from gambit.scoring.scorer import check_rows

CPU = torch.device("cpu")


def _python_calls_outside_scorer(fn) -> list[str]:
    """Python functions entered while ``fn`` runs, other than scorer.py's and this file's."""
    seen: list[str] = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_filename not in (scorer_module.__file__, __file__):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("rows,width", [(1, 194), (8, 194), (64, 194), (8, 578)])
def test_the_check_of_finite_rows_runs_no_python_outside_the_scorer(rows, width):
    x = torch.randn(rows, width)
    scorer = random_scorer("mlp", width - 2, confidence=True, invariant=False)
    keys = list(range(rows))
    assert _python_calls_outside_scorer(lambda: check_rows(x, width, width - 2, True, CPU)) == []
    assert _python_calls_outside_scorer(lambda: scorer.check_keys(keys, rows)) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("where", [(0, 0), (3, 100), (7, 193)])
def test_every_non_finite_value_is_still_refused(bad, where):
    x = torch.randn(8, 194)
    x[where] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        check_rows(x, 194, 192, True, CPU)
    x = torch.full((4, 194), 1e30)  # +inf and -inf together: the sum is NaN, refused too
    x[0, 0], x[1, 1] = float("inf"), float("-inf")
    with pytest.raises(ValueError, match="NaN or infinite"):
        check_rows(x, 194, 192, True, CPU)


@pytest.mark.parametrize("rows", [56, 57, 256])  # 57 x 578 is past SERIAL_SUM: numpy's check there
def test_non_finite_values_are_refused_at_every_batch_size(rows):
    assert (rows * 578 < scorer_module.SERIAL_SUM) == (rows == 56)
    x = torch.randn(rows, 578)
    assert check_rows(x, 578, 576, True, CPU) is x
    x[rows - 1, 577] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        check_rows(x, 578, 576, True, CPU)


def test_finite_rows_whose_sum_overflows_are_accepted():
    x = torch.full((64, 194), 3e38)  # every element finite, their float32 sum is inf
    assert not torch.isfinite(x.sum())
    assert check_rows(x, 194, 192, True, CPU) is x
    assert check_rows(torch.empty(0, 194), 194, 192, True, CPU).shape == (0, 194)


def test_rows_that_need_converting_are_converted_and_checked_after():
    x = torch.randn(3, 194, dtype=torch.float64, requires_grad=True)
    out = check_rows(x, 194, 192, True, CPU)
    assert out.dtype == torch.float32 and not out.requires_grad and torch.equal(out, x.detach().float())
    g = torch.randn(3, 194, requires_grad=True)
    assert not check_rows(g, 194, 192, True, CPU).requires_grad
    with pytest.raises(ValueError, match="NaN or infinite"):  # finite in float64, inf in float32
        check_rows(torch.full((1, 194), 1e300, dtype=torch.float64), 194, 192, True, CPU)
    assert check_rows(torch.randn(2, 194).bfloat16(), 194, 192, True, CPU).dtype == torch.float32


def test_an_unhashable_key_is_still_named():
    scorer = random_scorer("mlp", 192)
    with pytest.raises(ValueError, match=r"key \[1\] is not hashable"):
        scorer.check_keys([0, [1], 2], 3)
    assert scorer.check_keys((0, ("a", 1)), 2) == [0, ("a", 1)]



@pytest.mark.parametrize("arch", ["attn", "gru"])
def test_a_history_kept_from_uncopied_rows_is_not_the_callers_tensor(arch):
    """check_rows hands back the caller's float32 rows themselves; a sequence scorer's history must still
    be its own copy: the caller reusing its buffer afterwards changes no later score (a guard: the old
    ``detach().to()`` aliased them too)."""
    x = torch.randn(2, 194)
    kept, fresh = (random_scorer("sequence", 192, confidence=True, arch=arch) for _ in range(2))
    kept.score([0, 1], x)
    fresh.score([0, 1], x.clone())
    x.fill_(7.0)  # the caller's buffer, reused
    nxt = torch.randn(2, 194)
    assert torch.equal(kept.score([0, 1], nxt), fresh.score([0, 1], nxt))
