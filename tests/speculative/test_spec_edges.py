"""Speculative decoding at its edges equals plain decoding event for event (tokens, positions,
log-probabilities, finish reasons): stops inside an accepted draft (max_tokens, stop strings, EOS) with
greedy and sampled rows side by side, prompts a few tokens short of the context, and children forked from
speculative parents after several cycles. ``verify="match"`` and ``batch_invariant`` (the serving default
where it holds): the tree forward's logits are the plain step's, so every log-probability matches too."""

from __future__ import annotations

import pytest

from gambit.engine import Engine, EngineConfig, FinishedEvent, SamplingParams, TokenEvent
from gambit.engine.config import SpecConfig
from gambit.tasks.arithmetic import TaskConfig, generate

SPEC = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, verify="match", max_batch=0)
METHODS = ["eagle3.1", "pr"]


def _engine(target, **kw) -> Engine:
    model, tok = target
    kw.setdefault("num_blocks", 512)
    return Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=SPEC, batch_invariant=True,
                                           **kw))


def _prompts(tok) -> list[list[int]]:
    return [tok.encode(p.prompt) for p in generate("test", 5, 3, TaskConfig(2, 8))] + [[tok.bos_id]]


def _run(target, prompts, params: list[dict], decoding: str, **kw) -> tuple[list, Engine]:
    """Per trace: its token events (token, position, log-probability, top entries) and finish."""
    eng = _engine(target, **kw)
    ids = [eng.add(p, SamplingParams(decoding=decoding, **pp)) for p, pp in zip(prompts, params, strict=True)]
    events = []
    while eng.has_unfinished():
        events += eng.step()
    out = [([(e.token_id, e.position, e.logprob, e.top_logprobs) for e in events
             if isinstance(e, TokenEvent) and e.trace_id == t],
            [(e.reason, e.output_ids) for e in events if isinstance(e, FinishedEvent) and e.trace_id == t])
           for t in ids]
    assert eng.blocks.num_free == eng.num_blocks
    return out, eng


def _mixed(i: int, **kw) -> dict:
    """Greedy and sampled rows (top-k / top-p on some), a few asking for log-probabilities."""
    return dict(temperature=0 if i % 2 else 0.9, top_k=[0, 0, 20][i % 3], top_p=[1.0, 0.8, 1.0][i % 3],
                seed=10 + i, logprobs=[0, 1, 5][i % 3], **kw)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("stop", [dict(max_tokens=3), dict(max_tokens=5), dict(max_tokens=60, stop=["="]),
                                  dict(max_tokens=60, stop=["\n\n", "2+"]), dict(max_tokens=120)],
                         ids=["max_tokens=3", "max_tokens=5", "stop", "stops", "eos"])
def test_stops_inside_an_accepted_draft_equal_plain(target, method, stop):
    """A stop that falls inside a cycle's accepted tokens (max_tokens, a stop string, EOS at T = 0.9 and
    T = 0) ends the trace at plain decoding's token, reason and log-probabilities."""
    prompts = _prompts(target[1])
    params = [_mixed(i, **stop) for i in range(len(prompts))]
    ref, _ = _run(target, prompts, params, "plain")
    got, eng = _run(target, prompts, params, method)
    assert got == ref
    assert eng.stats.spec_drafts > 0 and eng.stats.spec_accepted > 0
    if "stop" in stop or stop["max_tokens"] == 120:  # the reason each row stopped is there to check
        assert {f[0][0] for _, f in ref} & {"stop", "eos"}


@pytest.mark.parametrize("method", METHODS)
def test_prompts_near_the_context_limit_equal_plain(target, method):
    """Prompts 2..30 tokens short of the context, side by side: each drafts while its tree fits
    (``N + gamma + 2 <= max_model_len``), steps plainly after, and ends at the context ("length") with
    plain decoding's tokens."""
    model, tok = target
    L = model.config.max_position_embeddings
    base = sum(_prompts(tok), [])
    prompts = [(base * (L // len(base) + 1))[:L - k] for k in (2, 3, 6, 9, 30)]
    params = [_mixed(i, max_tokens=100, ignore_eos=True) for i in range(len(prompts))]
    ref, _ = _run(target, prompts, params, "plain", num_blocks=1024)
    got, eng = _run(target, prompts, params, method, num_blocks=1024)
    assert got == ref
    assert eng.stats.spec_drafts > 0
    assert all(f == [("length", tuple(t for t, *_ in toks))] and toks[-1][1] == L - 1 for toks, f in ref)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("steps", [2, 5])
def test_children_forked_mid_speculation_continue_as_fresh_traces(target, method, steps):
    """Children forked after several speculative cycles (their own seeds, one at another temperature)
    inherit the drafter's state and emit exactly what a fresh plain trace of the parent's tokens with
    that seed and temperature emits."""
    model, tok = target
    prompts = _prompts(tok)[:4]
    eng = _engine(target)
    ids = [eng.add(p, SamplingParams(decoding=method, max_tokens=40, ignore_eos=True,
                                     **{k: v for k, v in _mixed(i).items() if k != "logprobs"}))
           for i, p in enumerate(prompts)]
    events = []
    for _ in range(steps):
        events += eng.step()
    assert eng.stats.spec_drafts > 0
    fresh = []  # (child, the parent's generated tokens, the parent's tokens, a fresh plain trace's params)
    for k, tid in enumerate(ids):
        t = eng.get(tid)
        seeds, temps = [100 + k, 200 + k], [t.params.temperature, 0.7]
        left = t.params.max_tokens - (len(t.token_ids) - t.prompt_len)
        for cid, seed, temp in zip(eng.fork(tid, 2, seeds=seeds, temperatures=temps), seeds, temps,
                                   strict=True):
            fresh.append((cid, t.token_ids[t.prompt_len:], list(t.token_ids),
                          dict(temperature=temp, top_k=t.params.top_k, top_p=t.params.top_p, seed=seed,
                               max_tokens=left, ignore_eos=True)))
    while eng.has_unfinished():
        events += eng.step()
    fin = {e.trace_id: list(e.output_ids) for e in events if isinstance(e, FinishedEvent)}
    ref, _ = _run(target, [p for *_, p, _ in fresh], [pp for *_, pp in fresh], "plain")
    for (cid, done, _, _), (_, f) in zip(fresh, ref, strict=True):
        assert fin[cid] == done + list(f[0][1]), cid
        assert len(fin[cid]) == 40
