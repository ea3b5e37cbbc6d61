"""``Engine.step(token_events=False)`` and the plain-loop sampling step change what the engine reports
and how fast, never what it generates: the same tokens, log-probabilities and non-token events."""

from __future__ import annotations

import pytest
from engine_util import make_engine

from gambit.engine import FinishedEvent, SamplingParams, TokenEvent

PROMPT = "Q: 17 + 25 * 3 - 8 = ?\n\n"


def _run(engine, token_events: bool, params: list[SamplingParams]):
    ids = engine.tokenizer.encode(PROMPT)
    tids = [engine.add(ids, p) for p in params]
    events = []
    for _ in range(2000):
        if not engine.has_unfinished():
            break
        events.extend(engine.step(token_events=token_events))
    traces = {e.trace_id: e.output_ids for e in events if isinstance(e, FinishedEvent)}
    other = [(type(e).__name__, e.trace_id, getattr(e, "position", None)) for e in events
             if not isinstance(e, TokenEvent)]
    return [traces[t] for t in tids], other, [e for e in events if isinstance(e, TokenEvent)]


@pytest.mark.parametrize("logprobs", [0, 1])
def test_no_token_events_same_generation(target, logprobs):
    params = [SamplingParams(temperature=0.8, max_tokens=60, seed=s, logprobs=logprobs) for s in range(6)]
    params.append(SamplingParams(temperature=0.0, max_tokens=40))  # a greedy row: the ATen path
    with_ev, other_a, tok_a = _run(make_engine(target), True, params)
    without, other_b, tok_b = _run(make_engine(target), False, params)
    assert with_ev == without
    assert other_a == other_b  # boundaries and finishes alike
    assert any(t == "BoundaryEvent" for t, _, _ in other_a)
    assert tok_a and not tok_b


def test_logprobs_kept_on_the_trace_without_events(target):
    eng_a, eng_b = make_engine(target), make_engine(target)
    p = SamplingParams(temperature=0.9, max_tokens=30, seed=7, logprobs=1)
    ids = eng_a.tokenizer.encode(PROMPT)
    ta, tb = eng_a.add(ids, p), eng_b.add(ids, p)
    seen = []
    for _ in range(10):
        seen += [e.logprob for e in eng_a.step() if isinstance(e, TokenEvent)]
        eng_b.step(token_events=False)
    assert eng_a.get(ta).logprobs == eng_b.get(tb).logprobs == seen


def test_fused_step_same_as_aten_path(target):
    """The plain-loop sampling step (where its probes pass) against the engine with it switched off."""
    params = [SamplingParams(temperature=0.6 + 0.1 * s, max_tokens=50, seed=s, logprobs=1) for s in range(5)]
    fused = make_engine(target)
    if fused._step_draw is None:
        pytest.skip("the plain-loop step does not serve here")
    aten = make_engine(target)
    aten._step_draw = None
    out_f, other_f, tok_f = _run(fused, True, params)
    out_a, other_a, tok_a = _run(aten, True, params)
    assert out_f == out_a and other_f == other_a
    assert [(e.token_id, e.logprob, e.top_logprobs) for e in tok_f] == \
        [(e.token_id, e.logprob, e.top_logprobs) for e in tok_a]


@pytest.mark.parametrize("mode", ["hot", "filtered", "greedy"])
def test_draw_rows_is_the_samplers_answer(target, mode):
    """``Engine.draw_rows`` (the plain-loop step where it serves, else the ATen calls) gives what
    ``sampler.sample`` and ``top_logprobs`` give for the same rows and settings."""
    import torch

    from gambit.engine.sampler import SamplingBatch, sample, top_logprobs

    eng = make_engine(target)
    g = torch.Generator().manual_seed(3)
    N, V = 24, target[0].config.vocab_size
    logits = torch.randn(N, V, generator=g) * 3
    temps = [0.0] * N if mode == "greedy" else [0.5 + 0.05 * i for i in range(N)]
    top_ks = [5 if mode == "filtered" and i % 2 else 0 for i in range(N)]
    top_ps = [0.9 if mode == "filtered" and i % 3 == 0 else 1.0 for i in range(N)]
    seeds, counters = list(range(100, 100 + N)), [7 * i for i in range(N)]
    tokens, lp = eng.draw_rows(logits, temps, top_ks, top_ps, seeds, counters, want=1, top=1)
    want = sample(logits.clone(), SamplingBatch.build(temps, top_ks, top_ps, seeds, counters, eng.device))
    chosen, vals, ids = top_logprobs(logits, want, 1)
    assert tokens == want.tolist()
    assert lp == (chosen.tolist(), vals.tolist(), ids.tolist())
