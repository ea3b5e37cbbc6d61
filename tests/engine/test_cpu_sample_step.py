"""The plain-loop sampling step (``cpu_sample_step.sample_step``) gives what ``sampler.sample`` and
``top_logprobs`` give: the same tokens, chosen log-probabilities and top entries."""

from __future__ import annotations

import pytest
import torch
from test_cpu_sampler import _batch

from gambit.engine import cpu_sample_step
from gambit.engine.sampler import CDF_BLOCK, SamplingBatch, sample, top_logprobs

step_kernel = cpu_sample_step.step_kernel(torch.device("cpu"), 100)
needs_step = pytest.mark.skipif(step_kernel is None, reason="the plain-loop step does not serve here")


def test_step_serves_on_x86():
    """Where the kernels build on x86 with MKL, the plain-loop step's probes must pass (else every step
    would quietly keep the ATen calls and the tests below would skip)."""
    import platform

    if platform.machine() in ("x86_64", "AMD64") and torch.backends.mkl.is_available():
        assert step_kernel is not None


@needs_step
@pytest.mark.parametrize("V", [100, 256, 257, 1000, 4099, 49152])
@pytest.mark.parametrize("top", [0, 1, 3, 20])
def test_step_equals_the_aten_path(V, top):
    """Tokens, chosen log-probabilities and the top entries of ``sample_step`` equal ``sample`` +
    ``top_logprobs`` (masked tokens, rows of ties, hot and cold rows, one row or many)."""
    for seed in range(4):
        B = 1 if seed == 3 else (64 if V < 10000 else 6)
        logits, sb = _batch(B, V, seed, "hot")
        temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
        want = sample(logits.clone(), sb)
        chosen, vals, ids = top_logprobs(logits, want, max(top, 1))
        tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, top, CDF_BLOCK, [], [])
        assert tok == want.tolist(), (V, top, seed)
        assert ch == chosen.tolist()
        if top:
            assert torch.equal(v, vals[:, :top]) and torch.equal(i, ids[:, :top])
        else:
            assert v is None and i is None


@needs_step
@pytest.mark.parametrize("mode", ["mixed", "greedy"])
def test_step_serves_greedy_rows(mode):
    """Greedy rows (temperature 0), among sampled ones or alone, take the logits' argmax: the tokens and
    log-probabilities of ``sample`` + ``top_logprobs``, with and without a nucleus on the other rows."""
    for V in (100, 4099):
        logits, sb = _batch(12, V, 1, mode)
        temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
        for top_k, top_p in (([], []), ([0, 5] * 6, [0.9, 1.0] * 6)):
            filt = SamplingBatch.build(temps, top_k or [0] * 12, top_p or [1.0] * 12, seeds, counters,
                                       torch.device("cpu"))
            want = sample(logits.clone(), filt)
            chosen, vals, ids = top_logprobs(logits, want, 1)
            tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, 1, CDF_BLOCK, top_k, top_p)
            assert tok == want.tolist(), (V, mode, top_p)
            assert ch == chosen.tolist() and torch.equal(v, vals) and torch.equal(i, ids)


@needs_step
def test_step_top1_picks_topks_entry_among_ties_and_nans():
    g = torch.Generator().manual_seed(5)
    logits = torch.randint(-3, 3, (32, 300), generator=g).float()  # many exact ties
    logits[3, :] = float("-inf")
    logits[3, 7] = 0.0
    logits[5, 11] = logits[5, 200] = float("nan")  # NaN ranks first in topk
    sb = SamplingBatch.build([0.7] * 32, [0] * 32, [1.0] * 32, list(range(32)), [9] * 32, torch.device("cpu"))
    temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
    tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, 1, CDF_BLOCK, [], [])
    lp = torch.log_softmax(logits, -1)
    want_v, want_i = lp.topk(1, -1)
    assert torch.equal(i, want_i) and torch.equal(v.isnan(), want_v.isnan())
    assert torch.equal(v.nan_to_num(), want_v.nan_to_num())


@needs_step
def test_step_reuses_its_scratch_without_leaking_between_calls():
    """The step keeps its [B, V] blocks across calls (a fresh 12 MB block a step was faulted in page by
    page at batch 64): a batch after a larger or a smaller one still gets the ATen path's answer, and
    what one call returned is not overwritten by the next."""
    first = None
    for B, seed in ((9, 0), (3, 1), (17, 2), (1, 3)):
        logits, sb = _batch(B, 4099, seed, "hot")
        temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
        want = sample(logits.clone(), sb)
        chosen, vals, ids = top_logprobs(logits, want, 3)
        for top in (1, 3):
            tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, top, CDF_BLOCK, [], [])
            assert tok == want.tolist() and ch == chosen.tolist(), (B, top)
            assert torch.equal(v, vals[:, :top]) and torch.equal(i, ids[:, :top])
            if first is None:
                first = (v.clone(), i.clone(), v, i)
    assert torch.equal(first[0], first[2]) and torch.equal(first[1], first[3])


@needs_step
def test_step_log_probabilities_with_an_inf_row_fall_back_to_aten():
    """A row whose maximum is not a number (inf, NaN) sends the whole step's log-probabilities through
    ATen's log_softmax: the same values as the ATen path, NaNs where it has them."""
    logits, sb = _batch(6, 4099, 0, "hot")
    logits[2, 5] = float("inf")
    temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
    want = sample(logits.clone(), sb)
    chosen, vals, ids = top_logprobs(logits, want, 3)
    for top in (1, 3):
        tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, top, CDF_BLOCK, [], [])
        assert tok == want.tolist()
        assert torch.equal(torch.tensor(ch).nan_to_num(), chosen.nan_to_num())
        assert torch.equal(v.nan_to_num(), vals[:, :top].nan_to_num()) and torch.equal(i, ids[:, :top])


@needs_step
@pytest.mark.parametrize("V", [100, 4099, 49152])
def test_step_with_top_k_and_top_p_equals_the_aten_path(V):
    """Rows with top-k / top-p go through the step too (filtered between the division and the draw, as
    the sampler does): ``sample`` + ``top_logprobs``' tokens and log-probabilities, filtered rows mixed
    with plain ones, and a batch where every row asks the same nucleus."""
    for seed in range(3):
        B = 24 if V < 10000 else 8
        logits, sb = _batch(B, V, seed, "hot")
        g = torch.Generator().manual_seed(seed)
        ks = torch.randint(0, V + 3, (B,), generator=g) * (torch.rand(B, generator=g) < 0.5)
        top_k = [int(x) for x in ks]
        top_p = [1.0 if i % 3 == 0 else 0.5 + 0.5 * float(x)
                 for i, x in enumerate(torch.rand(B, generator=g))]
        if seed == 2:
            top_k, top_p = [0] * B, [0.95] * B
        temps, seeds, counters = sb.temperature.tolist(), sb.seeds.tolist(), sb.counters.tolist()
        filt = SamplingBatch.build(temps, top_k, top_p, seeds, counters, torch.device("cpu"))
        want = sample(logits.clone(), filt)
        chosen, vals, ids = top_logprobs(logits, want, 3)
        tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, 3, CDF_BLOCK, top_k, top_p)
        assert tok == want.tolist(), (V, seed)
        assert ch == chosen.tolist()
        assert torch.equal(v, vals) and torch.equal(i, ids)


def _cold_rows(V: int, seed: int) -> torch.Tensor:
    """Rows as a low temperature leaves them: most entries far below the maximum (exp underflows to 0),
    some in the denormal band (-104, -87.3], some exactly at -104 or -inf, and one warm row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, V, generator=g) * 40
    x[1] = torch.empty(V).uniform_(-104.5, -87.0, generator=g)  # the band where exp's results are denormals
    x[1, 3] = 0.0
    x[2] = -104.0
    x[2, V // 2] = 0.0
    x[3, : V // 3] = float("-inf")
    x[4] = torch.randn(V, generator=g)  # warm: nothing underflows
    x[5] = torch.randn(V, generator=g)
    x[5, :: max(V // 10, 1)] = -300.0  # a few cold entries in a warm row (at V = 49152 under 1%: exp whole)
    return x


@needs_step
@pytest.mark.parametrize("V", [100, 4099, 49152])
def test_exp_of_cold_rows_is_atens(V):
    """exp(x - max) as the step takes it for an unfiltered row (entries at or below -104 written as 0
    without exp where a row has enough of them) equals ATen's bit for bit, the denormal band above -104
    included (its entries still go through exp)."""
    from gambit.engine import cpu_attention

    for seed in range(3):
        x = _cold_rows(V, seed)
        want = torch.exp(x - x.max(-1, keepdim=True).values)
        got = cpu_attention.kernel().sample_exp_rows(x.clone())
        assert torch.equal(got, want), (V, seed)
        assert (want[1] > 0).sum() > (want[1] == 1).sum()  # the band's denormals are there, and nonzero


@needs_step
@pytest.mark.parametrize("V", [100, 4099, 49152])
@pytest.mark.parametrize("top", [0, 1, 20])
def test_step_at_low_temperature_equals_the_aten_path(V, top):
    """Cold rows (T 0.02-0.2 over peaked logits: most of a row underflows), mixed with greedy and warm
    rows, with and without a nucleus: ``sample`` + ``top_logprobs``' tokens and log-probabilities."""
    B = 12
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(B, V, generator=g) * 8
        cold = (0.02 + 0.18 * torch.rand(B, generator=g)).tolist()
        temps = [0.0 if i % 4 == 0 else (1.0 if i % 4 == 1 else cold[i]) for i in range(B)]
        seeds = [int(x) for x in torch.randint(0, 2**62, (B,), generator=g)]
        counters = [int(x) for x in torch.randint(0, 4000, (B,), generator=g)]
        for top_k, top_p in (([], []), ([0, 7] * (B // 2), [0.9, 1.0] * (B // 2))):
            sb = SamplingBatch.build(temps, top_k or [0] * B, top_p or [1.0] * B, seeds, counters,
                                     torch.device("cpu"))
            want = sample(logits.clone(), sb)
            chosen, vals, ids = top_logprobs(logits, want, max(top, 1))
            tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, top, CDF_BLOCK, top_k, top_p)
            assert tok == want.tolist(), (V, top, seed, bool(top_k))
            assert ch == chosen.tolist()
            if top:
                assert torch.equal(v, vals[:, :top]) and torch.equal(i, ids[:, :top])


@needs_step
@pytest.mark.parametrize("V", [50, 300, 1000])
def test_step_aten_top_fallback_orders_ties_by_ascending_id(V):
    """The step's ATen fallback for the top entries (here forced by asking for more than V, which no probe
    covers) lists tied log-probabilities by ascending id, as the compiled path and ``top_entries`` do (it
    kept ``topk``'s order, which moves with k: a trace's list changed with its batch's largest ask)."""
    g = torch.Generator().manual_seed(V)
    logits = torch.randint(-2, 2, (5, V), generator=g).float()  # every row many exact ties
    logits[1, 7] = logits[1, V - 3] = float("nan")  # NaNs first, and tie with each other
    temps, seeds, counters = [0.7, 0.0, 1.3, 0.7, 0.0], [3, 4, 5, 6, 7], [9] * 5
    tok, ch, v, i = step_kernel(logits, temps, seeds, counters, 1, V, CDF_BLOCK, [], [])  # compiled
    want = top_logprobs(logits, torch.tensor(tok), V)
    assert torch.equal(i, want[2]) and torch.equal(v.nan_to_num(), want[1].nan_to_num())
    for top in (V + 1, V + 20):
        tok_f, ch_f, v_f, i_f = step_kernel(logits, temps, seeds, counters, 1, top, CDF_BLOCK, [], [])
        assert tok_f == tok and torch.equal(torch.tensor(ch_f).nan_to_num(), torch.tensor(ch).nan_to_num())
        assert torch.equal(i_f, i), (V, top)
        assert torch.equal(v_f.nan_to_num(), v.nan_to_num()) and torch.equal(v_f.isnan(), v.isnan())
