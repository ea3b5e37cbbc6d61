"""Sampling: counter-based determinism, the right distributions, filters, log-probabilities; and the
per-token events of the engine (finish reasons, top log-probabilities, thought-boundary hidden states).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from engine_util import closes_thought, drain, make_engine, tied_row

from gambit.engine import BoundaryEvent, FinishedEvent, SamplingParams, TokenEvent
from gambit.engine.sampler import SamplingBatch, filter_logits, sample, top_logprobs, uniforms

N = 20_000
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _batch(B, temperature=1.0, top_k=0, top_p=1.0, seeds=7, counters=None) -> SamplingBatch:
    def col(x):
        return x if isinstance(x, list) else [x] * B

    counters = list(range(B)) if counters is None else col(counters)
    return SamplingBatch.build(col(temperature), col(top_k), col(top_p), col(seeds), counters, "cpu")


def _chi2(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square of observed token counts against expected probabilities (all > 0)."""
    obs = torch.bincount(tokens, minlength=len(probs)).double()
    exp = probs.double() * len(tokens)
    return float(((obs - exp) ** 2 / exp).sum())


# chi-square with 5 degrees of freedom: P(X > 25) ~ 1.4e-4 (draws are deterministic, so no flakiness)
CHI2_MAX = 25.0


# -- the noise ---------------------------------------------------------------------------------
def test_uniforms_are_a_function_of_seed_and_counter():
    seeds = torch.tensor([1, 1, 2, 3, 1])
    counters = torch.tensor([0, 1, 0, 0, 0])
    u = uniforms(seeds, counters, 50)
    assert u.shape == (5, 50) and u.dtype == torch.float32
    assert torch.equal(u, uniforms(seeds, counters, 50))  # deterministic
    assert torch.equal(u[0], u[4])  # same (seed, counter), same noise, wherever the row sits
    for i in range(4):
        alone = uniforms(seeds[i:i + 1], counters[i:i + 1], 50)
        assert torch.equal(alone[0], u[i])
        for j in range(i + 1, 4):
            assert not torch.equal(u[i], u[j])  # other seed or other counter: other noise
    assert not torch.equal(uniforms(seeds, counters, 50, stream=1), u)  # streams are separate
    assert torch.equal(uniforms(seeds, counters, 20), u[:, :20])  # the width does not reseed
    big = uniforms(torch.full((2000,), 9), torch.arange(2000), 64)
    assert 0 < big.min() and big.max() < 1
    assert abs(big.mean().item() - 0.5) < 0.005 and abs(big.var().item() - 1 / 12) < 0.002


def test_sample_is_deterministic_and_batch_independent():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 100, generator=g) * 2
    b = _batch(64, temperature=1.0, seeds=list(range(64)), counters=[5] * 64)
    first = sample(logits, b)
    assert torch.equal(first, sample(logits, b))
    perm = torch.randperm(64, generator=g)
    bp = _batch(64, temperature=1.0, seeds=[int(s) for s in perm], counters=[5] * 64)
    assert torch.equal(sample(logits[perm], bp), first[perm])  # a row's draw ignores its neighbours
    # different seeds really draw different tokens on a flat distribution
    flat = torch.zeros(64, 100)
    assert len(set(sample(flat, b).tolist())) > 30
    # and the same seed at different counters too
    assert len(set(sample(flat, _batch(64, seeds=3)).tolist())) > 30


# -- distributions -------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_empirical_distribution_matches_softmax(temperature):
    draws = sample(LOGITS.expand(N, -1), _batch(N, temperature=temperature))
    probs = torch.softmax(LOGITS / temperature, -1)
    assert _chi2(draws, probs) < CHI2_MAX
    # the test has power: the same draws are far from the distribution at another temperature
    other = torch.softmax(LOGITS / (temperature * 1.3), -1)
    assert _chi2(draws, other) > 10 * CHI2_MAX


def test_distribution_across_seeds_at_one_counter():
    draws = sample(LOGITS.expand(N, -1), _batch(N, seeds=list(range(N)), counters=17))
    assert _chi2(draws, torch.softmax(LOGITS, -1)) < CHI2_MAX


def test_top_k_one_is_greedy():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2000, 100, generator=g)
    b = _batch(2000, temperature=1.7, top_k=1, seeds=list(range(2000)))
    assert torch.equal(sample(logits, b), logits.argmax(-1))


def test_top_k_keeps_the_k_best_with_renormalised_probabilities():
    draws = sample(LOGITS.expand(N, -1), _batch(N, top_k=3))
    assert set(draws.tolist()) == {0, 1, 2}
    probs = torch.softmax(LOGITS[:3], -1)
    assert _chi2(draws, torch.cat([probs, torch.ones(3)])[:3]) < CHI2_MAX


def test_top_p_keeps_exactly_the_nucleus():
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
    logits = probs.log()
    # cumulative probability before each token: 0, .5, .8, .9, .96 → top_p .85 keeps 0, 1, 2
    kept = filter_logits(logits.expand(3, -1), torch.tensor([0, 0, 2]), torch.tensor([0.85, 0.45, 0.95]))
    assert torch.isfinite(kept).tolist() == [[True, True, True, False, False],
                                             [True, False, False, False, False],  # always the top one
                                             [True, True, False, False, False]]  # top_k and top_p
    assert torch.equal(kept[0, :3], logits[:3])
    draws = sample(logits.expand(N, -1), _batch(N, top_p=0.85))
    assert set(draws.tolist()) == {0, 1, 2}  # nothing outside the nucleus, everything inside it
    assert _chi2(draws, probs[:3] / probs[:3].sum()) < 15.0  # 2 degrees of freedom
    tiny_p = sample(logits.expand(1000, -1), _batch(1000, top_p=0.01))
    assert set(tiny_p.tolist()) == {0}


def test_no_filter_is_identity():
    logits = torch.randn(4, 30)
    assert torch.equal(filter_logits(logits, torch.zeros(4, dtype=torch.long), torch.ones(4)), logits)
    assert torch.equal(filter_logits(logits, torch.full((4,), 30), torch.ones(4)), logits)


def test_temperature_zero_rows_are_argmax_in_a_mixed_batch():
    g = torch.Generator().manual_seed(2)
    B = 256
    logits = torch.randn(B, 100, generator=g)
    temps = [0.0 if i % 2 else 1.5 for i in range(B)]
    top_k = [0 if i % 3 else 5 for i in range(B)]
    top_p = [1.0 if i % 5 else 0.7 for i in range(B)]
    b = _batch(B, temperature=temps, top_k=top_k, top_p=top_p, seeds=list(range(B)))
    out = sample(logits, b)
    greedy = logits.argmax(-1)
    cold = torch.tensor(temps) == 0
    assert torch.equal(out[cold], greedy[cold])
    assert not torch.equal(out[~cold], greedy[~cold])  # the hot rows really sample
    for i in range(0, B, 17):  # each hot row as if alone
        alone = sample(logits[i:i + 1], _batch(1, temps[i], top_k[i], top_p[i], seeds=i, counters=i))
        assert int(alone) == int(out[i])
    # all-greedy batches take the shortcut and still agree
    assert torch.equal(sample(logits, _batch(B, temperature=0.0)), greedy)


def test_noise_never_overrides_filters():
    """Regression: a uniform within 2**-25 of 1 used to round to 1.0 in float32; its Gumbel noise
    was +inf and that token won whatever its logit, even a filtered -inf one (-inf + inf = nan, and
    argmax picks nan). With a 150k vocabulary that hit about one sampled token in 220.

    (seed 12345, counter 130599) draws such a uniform for vocabulary index 66 (found by search).
    """
    u = uniforms(torch.tensor([12345]), torch.tensor([130599]), 128)
    assert u.max() < 1.0 and u.min() > 0.0
    logits = torch.full((1, 128), -30.0)
    logits[0, 3] = 30.0
    for top_k, top_p in ((1, 1.0), (0, 0.5), (0, 1.0)):
        b = _batch(1, temperature=1.0, top_k=top_k, top_p=top_p, seeds=12345, counters=130599)
        assert sample(logits, b).tolist() == [3], (top_k, top_p)


@pytest.mark.parametrize("V", [6, 300, 4096 + 17])
def test_two_level_cdf_draws_what_one_float64_cumsum_draws(V):
    """The block CDF inverts the same distribution as a float64 cumsum over the whole row."""
    from gambit.engine.sampler import _invert_cdf_

    g = torch.Generator().manual_seed(V)
    logits = torch.randn(64, V, generator=g) * torch.linspace(0.5, 6, 64)[:, None]
    logits[::3, ::5] = float("-inf")  # filtered entries: zero weight, never drawn
    u = torch.rand(64, generator=g).clamp(1e-12, 1 - 2.0 ** -24)
    w = (logits - logits.max(-1, keepdim=True).values).exp().double().cumsum(-1)
    want = torch.searchsorted(w, (u.double() * w[:, -1])[:, None], right=True)[:, 0]
    got = _invert_cdf_(logits.clone(), u)[0]
    assert torch.equal(got, want)
    assert torch.isfinite(logits.gather(1, got[:, None])).all()
    edge = _invert_cdf_(logits.clone(), torch.full((64,), 1 - 2.0 ** -24))[0]  # u at its top
    assert torch.isfinite(logits.gather(1, edge[:, None])).all()


def test_top_logprobs_equal_log_softmax():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 100, generator=g) * 3
    tokens = torch.randint(0, 100, (8,), generator=g)
    chosen, vals, ids = top_logprobs(logits, tokens, 20)
    lp = torch.log_softmax(logits.double(), -1)
    assert torch.allclose(chosen.double(), lp.gather(1, tokens[:, None])[:, 0], atol=1e-5)
    ref_vals, ref_ids = lp.sort(-1, descending=True)
    assert vals.shape == ids.shape == (8, 20)
    assert torch.allclose(vals.double(), ref_vals[:, :20], atol=1e-5)
    assert torch.equal(ids, ref_ids[:, :20])
    assert torch.allclose(vals.double(), lp.gather(1, ids), atol=1e-5)


def test_top_logprobs_of_a_row_ignore_what_the_batch_asks():
    """A trace's top 5 are the first 5 of the batch's top 20 (the engine asks for the largest
    ``logprobs`` of the batch): ties at the cut go to the lower id, whatever k."""
    logits, tok = tied_row()[None], torch.tensor([0])
    tops = {n: top_logprobs(logits, tok, n) for n in (5, 6, 20)}
    assert tops[5][2][0].tolist() == [7, 8, 9, 10, 29]
    assert torch.equal(tops[5][2], tops[20][2][:, :5]) and torch.equal(tops[6][2], tops[20][2][:, :6])
    assert torch.equal(tops[5][1], tops[20][1][:, :5])
    assert tops[6][2][0, 5] == 84


@pytest.mark.parametrize("decoding", ["plain", "pr"])
@pytest.mark.parametrize("path", ["compiled", "aten"])
def test_top_logprobs_alone_equal_beside_a_logprobs_20_trace(target, decoding, path):
    """The hunt's case: bfloat16 weights and KV quantise the logits, so log-probabilities tie; a trace's
    top 5 (ids and values) are the same alone and beside a trace asking for 20 (DeepConf's), on the
    compiled sampling step and on the ATen one (``_step_draw`` off). On the shipped target position 41
    of this prompt has a tie at the fifth place."""
    from gambit.engine.config import SpecConfig
    from gambit.tasks.arithmetic import TaskConfig, generate

    prompts = [target[1].encode(p.prompt) for p in generate("test", 4, 3, TaskConfig(2, 6))]
    spec = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=0)
    outs = []
    for other in (0, 20):
        eng = make_engine(target, num_blocks=512, batch_invariant=True, kv_dtype="bfloat16",
                          cpu_weights="bfloat16", spec=spec)
        if path == "aten":
            eng._step_draw = None
        a = eng.add(prompts[0], SamplingParams(temperature=0.8, logprobs=5, seed=1, max_tokens=40,
                                               decoding=decoding))
        if other:
            eng.add(prompts[1], SamplingParams(temperature=0.8, logprobs=other, seed=2, max_tokens=40,
                                               decoding=decoding))
        outs.append([(e.position, e.top_logprobs) for e in drain(eng)
                     if isinstance(e, TokenEvent) and e.trace_id == a])
    assert len(outs[0]) == 40 and outs[0] == outs[1]

# -- through the engine -----------------------------------------------------------------------------
PROMPT = "Compute 12*3+4.\nSolution:\n"


def _fin(events) -> dict[int, FinishedEvent]:
    return {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}


def test_max_tokens_finishes_with_length(tiny):
    eng = make_engine(tiny, block_size=4, num_blocks=128)
    ids = {n: eng.add(PROMPT, SamplingParams(temperature=0.9, max_tokens=n, ignore_eos=True, seed=n))
           for n in (1, 2, 7, 30)}
    fin = _fin(drain(eng))
    for n, tid in ids.items():
        assert fin[tid].reason == "length" and len(fin[tid].output_ids) == n


def _engine_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gambit.engine.engine"]


def test_the_kv_cache_limit_is_length_and_said_once(tiny, caplog):
    """A trace that outgrows the whole KV cache ends with "length" (the search, the gRPC end_reason and
    the metric labels read it as "cut at its limit"), and the engine says so once, naming the blocks:
    a user sizing the cache could not tell why outputs were short."""
    eng = make_engine(tiny, block_size=4, num_blocks=8)  # 32 slots; the context holds 256
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    with caplog.at_level(logging.WARNING, logger="gambit.engine.engine"):
        short = eng.add([5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        fin = _fin(drain(eng))
        assert (fin[short].reason, len(fin[short].output_ids)) == ("length", 4)
        assert not _engine_lines(caplog)  # max_tokens: nothing to say
        ids = [eng.add([5, 6, 7], params) for _ in range(2)]
        fin = _fin(drain(eng))
    assert [(fin[i].reason, len(fin[i].output_ids)) for i in ids] == [("length", 29)] * 2
    lines = _engine_lines(caplog)
    assert len(lines) == 1, lines  # once per engine, not once per trace
    assert "at 32 tokens, all the KV cache holds (8 blocks of 4 tokens), before its max_tokens 100" \
        in lines[0] and "num_blocks" in lines[0]


def test_eos_finishes_unless_ignored(tiny):
    _, tok = tiny
    eos = tok.eos_ids[0]
    eng = make_engine(tiny, block_size=8, num_blocks=512)
    params = [SamplingParams(temperature=3.0, max_tokens=150, ignore_eos=True, seed=s) for s in range(16)]
    free_run = eng.generate([PROMPT] * 16, params)
    with_eos = [(s, out) for s, out in enumerate(free_run) if eos in out[:-1]]
    assert with_eos, "no seed produced an EOS mid-run; pick other seeds"
    s, out = with_eos[0]
    eng2 = make_engine(tiny, block_size=8, num_blocks=512)
    tid = eng2.add(PROMPT, SamplingParams(temperature=3.0, max_tokens=150, seed=s))
    fin = _fin(drain(eng2))[tid]
    first = out.index(eos)
    assert fin.reason == "eos"
    assert list(fin.output_ids) == out[: first + 1]  # stops on EOS, EOS included, same draws before


def test_stop_strings(target):
    _, tok = target
    eng = make_engine(target, block_size=8, num_blocks=256)
    base = eng.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    text = tok.decode(base)
    stop = text[10:13]
    assert len(stop) == 3
    cut = text.index(stop) + len(stop)  # the first occurrence may come earlier than 10
    tid = eng.add(PROMPT, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                         stop=("never-in-output-\x01", stop)))
    fin = _fin(drain(eng))[tid]
    out = list(fin.output_ids)
    assert fin.reason == "stop"
    assert out == base[: len(out)]  # same tokens up to the stop
    decoded = tok.decode(out)
    assert stop in decoded and stop not in tok.decode(out[:-1])  # stopped at the first hit
    assert decoded == text[: len(decoded)]
    assert cut <= len(decoded) < cut + len(tok.decode(out[-1:]))


def test_one_stop_string_is_one_stop(target):
    """``stop="xyz"`` stops on "xyz" as ``stop=("xyz",)`` does (OpenAI's API and vLLM take one string);
    it was the three stops "x", "y" and "z", and ended the trace at the first of those letters."""
    _, tok = target
    eng = make_engine(target, block_size=8, num_blocks=256)
    base = eng.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    text = tok.decode(base)
    # a stop whose first hit is at k while one of its letters comes earlier (a one-letter stop fires there)
    k = next(k for k in range(10, len(text) - 3) if min(text.find(c) for c in text[k:k + 3]) < k
             and text.index(text[k:k + 3]) == k)
    stop = text[k:k + 3]
    outs = [eng.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=s))[0]
            for s in (stop, (stop,), [stop])]
    assert outs[0] == outs[1] == outs[2]
    decoded = tok.decode(outs[0])
    assert stop in decoded and stop not in tok.decode(outs[0][:-1]) and len(decoded) >= k + 3


def test_logprobs_events(target):
    model, tok = target
    eng = make_engine(target, block_size=8, num_blocks=256)
    counts = {}
    for n in (20, 3, 0, 1):
        sp = SamplingParams(temperature=0.7, max_tokens=6, logprobs=n, seed=n, ignore_eos=True)
        tid = eng.add(PROMPT, sp)
        counts[tid] = n
    events = drain(eng)
    fin = _fin(events)
    for tid, n in counts.items():
        toks = [e for e in events if isinstance(e, TokenEvent) and e.trace_id == tid]
        assert len(toks) == 6
        ids = tok.encode(PROMPT) + list(fin[tid].output_ids)
        with torch.no_grad():
            lp = torch.log_softmax(model.logits(model(torch.tensor([ids]))[0][0]).double(), -1)
        for e in toks:
            if n == 0:
                assert e.logprob is None and e.top_logprobs is None
                continue
            row = lp[e.position - 1]  # the distribution the token was drawn from, before temperature
            assert len(e.top_logprobs) == n
            assert math.isclose(e.logprob, float(row[e.token_id]), abs_tol=1e-4)
            ref_vals, ref_ids = row.topk(n)
            assert [i for i, _ in e.top_logprobs] == ref_ids.tolist()
            assert torch.allclose(torch.tensor([v for _, v in e.top_logprobs], dtype=torch.double), ref_vals,
                                  atol=1e-4)
            assert all(a[1] >= b[1] for a, b in zip(e.top_logprobs, e.top_logprobs[1:], strict=False))
            assert e.logprob <= e.top_logprobs[0][1] + 1e-6


def _boundary_run(target, **cfg):
    """16 traces (half near-greedy, half hot) from a prompt that contains the boundary token."""
    eng = make_engine(target, **cfg)
    prompt = "Compute 1+1+1.\nSolution:\n1+1=2\n\n"
    ids = [eng.add(prompt, SamplingParams(temperature=1.0 if s < 8 else 3.0, max_tokens=80, seed=s,
                                          ignore_eos=True)) for s in range(16)]
    events = drain(eng)
    return eng, ids, events


def _check_boundaries(target, eng, ids, events):
    model, tok = target
    boundary = tok.boundary_ids
    assert len(boundary) == 1 and tok.encode("\n\n", add_bos=False)[0] in boundary
    prompt = eng.tokenizer.encode("Compute 1+1+1.\nSolution:\n1+1=2\n\n")
    assert prompt[-1] in boundary  # the prompt has one: it must not be reported
    fin = _fin(events)
    total = 0
    for tid in ids:
        full = prompt + list(fin[tid].output_ids)
        got = [e for e in events if isinstance(e, BoundaryEvent) and e.trace_id == tid]
        # every generated boundary token that was fed (the last token never is), once, in order;
        want = [p for p in range(len(prompt), len(full) - 1) if closes_thought(tok, full, p)]
        assert [e.position for e in got] == want, tid
        total += len(want)
        if got:
            with torch.no_grad():
                hidden = model(torch.tensor([full]))[0][0]
            for e in got:
                assert e.hidden.shape == (model.config.hidden_size,)
                assert torch.allclose(e.hidden, hidden[e.position], atol=1e-4), (tid, e.position)
    assert total >= 2, "too few generated boundaries to test anything; change the seeds"


def test_boundary_events_carry_post_norm_hidden_states(target):
    eng, ids, events = _boundary_run(target, block_size=8, num_blocks=512)
    _check_boundaries(target, eng, ids, events)


def test_boundary_events_not_repeated_after_recompute(target):
    """A preempted trace re-feeds its generated tokens; its boundaries were already reported."""
    eng, ids, events = _boundary_run(target, block_size=4, num_blocks=40, preemption="recompute")
    assert eng.stats.preemptions > 0
    _check_boundaries(target, eng, ids, events)


@pytest.mark.parametrize("temps", [[0.0, 0.0, 0.0], [0.8, 0.0, 1.3], [0.8, 0.5, 1.3]])
def test_rows_that_sample_are_known_on_the_host(temps):
    """``build`` records which rows sample (no device read to branch on CUDA); the tokens equal those
    of a batch that reads them off the tensor, greedy rows their argmax."""
    from dataclasses import replace

    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(3))
    sb = _batch(3, temperature=temps, top_k=[0, 5, 0], top_p=[1.0, 1.0, 0.9], seeds=[1, 2, 3])
    assert sb.hot == {0: "none", 3: "all"}.get(sum(t > 0 for t in temps), "some")
    assert sb.seeds.tolist() == [1, 2, 3] and sb.top_k.tolist() == [0, 5, 0]
    assert sb.top_p.tolist() == pytest.approx([1.0, 1.0, 0.9])
    assert sb.temperature.tolist() == pytest.approx(temps)
    got = sample(logits.clone(), sb)
    assert torch.equal(got, sample(logits.clone(), replace(sb, hot=None)))
    greedy = [i for i, t in enumerate(temps) if t == 0]
    assert got[greedy].tolist() == logits.argmax(-1)[greedy].tolist()


def test_top_p_of_one_filters_nothing_beside_other_rows():
    """A row with top_p = 1 in a batch where another asks for a nucleus keeps every token its top-k
    keeps: the cumulative probability can round past 1.0 in float32, and that must not cut its tail."""
    logits = torch.full((2, 2000), -30.0)
    logits[:, 0] = 10.0  # nearly all the mass on one token: the tail's cumsum sits at ~1.0
    logits[:, 1:] += torch.linspace(0, 1, 1999)
    kept = filter_logits(logits, torch.tensor([0, 0]), torch.tensor([1.0, 0.5])).isfinite()
    assert kept[0].all()
    assert kept[1].sum() == 1
