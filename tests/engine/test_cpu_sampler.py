"""The compiled sampler draws exactly the tokens of ``sampler.sample`` (same ATen calls in C++)."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import cpu_sampler
from gambit.engine.sampler import SamplingBatch, sample

pytestmark = pytest.mark.skipif(not cpu_sampler.available(torch.device("cpu")), reason="no C++ kernels")


def _batch(B: int, V: int, seed: int, mode: str) -> tuple[torch.Tensor, SamplingBatch]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * (1 + 4 * torch.rand(B, 1, generator=g))
    logits[:, torch.randint(0, V, (V // 10,), generator=g)] = float("-inf")  # impossible tokens
    logits[0, :] = 0.0  # a row of ties
    temps = (0.3 + 1.5 * torch.rand(B, generator=g)).tolist()
    if mode == "mixed":  # greedy rows among sampled ones
        temps = [0.0 if i % 3 == 0 else t for i, t in enumerate(temps)]
    if mode == "greedy":
        temps = [0.0] * B
    top_k = [int(x) for x in torch.randint(0, V + 5, (B,), generator=g)] if mode == "filtered" else [0] * B
    top_p = [0.5 + 0.5 * float(x) for x in torch.rand(B, generator=g)] if mode == "filtered" else [1.0] * B
    seeds = [int(x) for x in torch.randint(0, 2**62, (B,), generator=g)]
    counters = [int(x) for x in torch.randint(0, 4000, (B,), generator=g)]
    return logits, SamplingBatch.build(temps, top_k, top_p, seeds, counters, torch.device("cpu"))


@pytest.mark.parametrize("V", [100, 256, 1000, 4099])
@pytest.mark.parametrize("mode", ["hot", "mixed", "greedy", "filtered"])
def test_same_tokens_as_the_python_sampler(V, mode):
    for seed in range(6):
        logits, sb = _batch(64, V, seed, mode)
        want = sample(logits.clone(), sb)
        got = cpu_sampler.sample(logits.clone(), sb)
        assert torch.equal(got, want), (V, mode, seed)
        assert got.dtype == want.dtype == torch.long


def test_leaves_the_logits_alone():
    logits, sb = _batch(8, 100, 0, "filtered")
    before = logits.clone()
    cpu_sampler.sample(logits, sb)
    assert torch.equal(logits, before)


def test_atens_float64_cumsum_accumulates_in_order():
    """What the C++ sampler's plain loops rely on: ``cumsum_`` of float64 rows is the running sum taken
    left to right from 0 (the token only moves when a uniform lands within an ulp of an edge, so the
    token comparison above would rarely see a different order; this checks the order itself)."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 7, 64, 196, 256, 1000):
        scale = torch.logspace(-8, 2, n, dtype=torch.float64)
        x = torch.rand(16, n, generator=g, dtype=torch.float64) * scale
        got = x.clone().cumsum_(-1)
        for row, want_row in zip(x.tolist(), got.tolist(), strict=True):
            acc, want = 0.0, []
            for v in row:
                acc += v
                want.append(acc)
            assert want == want_row, n



@pytest.mark.parametrize("V", [1, 5, 16, 63, 64, 65, 100, 4097, 49152])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_argmax_gives_atens_indices(V, rows):
    """Ties go to the first index, a NaN ranks above every number (the first NaN wins), -0 ties +0, a row
    of -inf answers 0; rows split over threads, views and batches of rows as ATen's ``argmax(-1)``."""
    g = torch.Generator().manual_seed(V * 100 + rows)
    x = torch.randn(rows, V, generator=g) * 100
    if V > 2:
        top = x[0].max()
        x[0, V // 2], x[0, V - 1] = top + 1, top + 1  # a tie: the first one
    x[-1] = float("-inf")
    if rows > 2 and V > 3:
        x[1, V - 2], x[1, V // 3] = float("nan"), float("nan")
        x[2], x[2, V - 1], x[2, 0] = -1.0, 0.0, -0.0
    assert torch.equal(cpu_sampler.argmax(x), x.argmax(-1))
    assert cpu_sampler.argmax(x).tolist() == [int(r.argmax()) for r in x]  # one row at a time too
    y = torch.randn(2, 2 * rows, V, generator=g)[:, ::2]  # [2, rows, V], not contiguous
    assert torch.equal(cpu_sampler.argmax(y), y.argmax(-1))


def test_filter_ranks_tied_logits_by_vocabulary_index():
    """Top-k / top-p ranks come from a stable sort: of tied logits at the edge of the nucleus the lowest
    indices stay, in the Python sampler and the compiled one alike (draws that can only land on kept
    tokens)."""
    from gambit.engine.sampler import filter_logits

    logits = torch.zeros(1, 140)
    logits[0, 5] = 3.0
    logits[0, [9, 20, 40, 77]] = 2.0  # tied at the top-3 edge
    V = logits.shape[1]
    kept = filter_logits(logits, torch.tensor([3]), torch.tensor([1.0])).isfinite()[0]
    assert kept.nonzero().flatten().tolist() == [5, 9, 20]  # the 3, then the first two of the tied 2s
    B = 64
    sb = SamplingBatch.build([50.0] * B, [3] * B, [1.0] * B, list(range(B)), [0] * B, torch.device("cpu"))
    draws = cpu_sampler.sample(logits.expand(B, V).contiguous(), sb)
    assert torch.equal(draws, sample(logits.expand(B, V).clone(), sb))
    assert set(draws.tolist()) == {5, 9, 20}
