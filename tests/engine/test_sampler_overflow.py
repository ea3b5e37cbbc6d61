"""A row whose scaled logits are no distribution (+inf where logits / a tiny temperature overflowed, a NaN,
all -inf) takes its argmax on every sampling path, the T -> 0 limit, not the index a NaN CDF search lands
on; the batch's other rows draw what they draw alone."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_sample_step, cpu_sampler
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch, sample


def _step(x, batch):
    k = cpu_sample_step.step_kernel(torch.device("cpu"), x.shape[1])
    if k is None:
        pytest.skip("the plain-loop step does not serve here")
    return torch.tensor(k(x, batch.temperature.tolist(), batch.seeds.tolist(), batch.counters.tolist(), 0, 0,
                          CDF_BLOCK, batch.top_k.tolist(), batch.top_p.tolist())[0])


def _compiled(x, batch):
    if not cpu_sampler.available(x.device):
        pytest.skip("no C++ kernels")
    return cpu_sampler.sample(x, batch)


PATHS = {"python": sample, "compiled": _compiled, "step": _step}


def _rows(V: int) -> torch.Tensor:
    x = torch.linspace(-2, 2, V).repeat(5, 1)
    x[:, 100], x[:, 7] = 5.0, 4.999
    x[1, 3] = float("nan")
    x[2] = float("-inf")
    x[3, [9, 11]] = float("inf")
    return x


@pytest.mark.parametrize("V", [300, 2000])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("filters", [(0, 1.0), (5, 1.0), (0, 0.5)])
def test_rows_that_are_no_distribution_take_their_argmax(path, V, filters):
    x, draw = _rows(V), PATHS[path]
    k, p = filters
    for temp in (1e-38, 1e-45):  # 5 / T overflows: every row has +inf
        batch = SamplingBatch.build([temp] * 5, [k] * 5, [p] * 5, list(range(5)), [0] * 5, "cpu")
        assert draw(x.clone(), batch).tolist() == [100, 3, 0, 9, 100], temp
    temps = [1.0, 1.0, 1.0, 1.0, 0.7]
    for c in range(8):
        batch = SamplingBatch.build(temps, [k] * 5, [p] * 5, list(range(5)), [c] * 5, "cpu")
        got = draw(x.clone(), batch).tolist()
        assert got[1:4] == [3, 0, 9], c  # NaN: its first NaN; all -inf: 0; +inf: the first +inf
        for row in (0, 4):  # a finite row draws what it draws alone
            alone = SamplingBatch.build([temps[row]], [k], [p], [row], [c], "cpu")
            assert got[row] == draw(x[row:row + 1].clone(), alone).item()
