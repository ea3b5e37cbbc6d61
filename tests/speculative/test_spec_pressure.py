"""Speculative decoding under KV pressure equals plain decoding: a batch mixing plain, pr and eagle3.1
traces with their own max_tokens and log-probabilities, on a cache small enough to preempt (recompute)
or evict, with forks and an abort mid-run."""

from __future__ import annotations

import pytest

from gambit.engine import Engine, EngineConfig, EvictedEvent, FinishedEvent, SamplingParams, TokenEvent
from gambit.engine.config import SpecConfig
from gambit.tasks.arithmetic import TaskConfig, generate

SPEC = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=0)
MIX = ["pr", "eagle3.1", "plain", "pr", "eagle3.1", "plain", "pr", "eagle3.1"]
MAX_TOKENS = [60, 3, 45, 80, 70, 2, 90, 33]


def _run(target, decodings, forks=(), aborts=(), **kw):
    """Final (kind, reason, output) and (position, token, logprob) per trace id; fork children too."""
    model, tok = target
    kw.setdefault("num_blocks", 512)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=SPEC, batch_invariant=True,
                                          **kw))
    prompts = [tok.encode(p.prompt) for p in generate("test", 10, 3, TaskConfig(2, 8))][:8]
    ids = [eng.add(p, SamplingParams(temperature=0, decoding=d, max_tokens=m, logprobs=2))
           for p, d, m in zip(prompts, decodings, MAX_TOKENS, strict=True)]
    events, kids = [], {}
    for step in range(3000):
        if not eng.has_unfinished():
            break
        live = lambda k: ids[k] in eng.traces and not eng.get(ids[k]).is_done  # noqa: E731
        kids.update({eng.fork(ids[k], 1)[0]: k for s, k in forks if s == step and live(k)})
        for k in [k for s, k in aborts if s == step and live(k)]:
            eng.abort(ids[k])
        events += eng.step()
    ends = {e.trace_id: (type(e).__name__, getattr(e, "reason", None), list(e.output_ids))
            for e in events if isinstance(e, FinishedEvent | EvictedEvent)}
    toks: dict[int, list] = {}
    for e in events:
        if isinstance(e, TokenEvent):
            toks.setdefault(e.trace_id, []).append((e.position, e.token_id, e.logprob))
    assert eng.blocks.num_free == eng.num_blocks
    return eng, ids, kids, ends, toks


@pytest.fixture(scope="module")
def plain(target):
    return _run(target, ["plain"] * 8)


def _same_as_plain(got, ref, ended_early=()):
    _, ids, kids, ends, toks = got
    _, rids, _, rends, rtoks = ref
    for k, (a, b) in enumerate(zip(ids, rids, strict=True)):
        out, want = ends[a][2], rends[b][2]
        if ends[a][0] == "EvictedEvent" or ends[a][1] == "abort" or k in ended_early:
            assert out == want[:len(out)], k
        else:
            assert ends[a][1:] == rends[b][1:], k  # the same tokens and reason (max_tokens inside a path)
        mine, theirs = toks.get(a, []), rtoks[b][:len(toks.get(a, []))]
        assert [x[:2] for x in mine] == [x[:2] for x in theirs], k
        assert all(abs(x[2] - y[2]) < 1e-4 for x, y in zip(mine, theirs, strict=True)), k
    for c, k in kids.items():
        out, want = ends[c][2], rends[rids[k]][2]
        assert out == (want if ends[c][0] == "FinishedEvent" else want[:len(out)]), f"child of {k}"


@pytest.mark.parametrize("lookahead", [0, None])
def test_mixed_batch_with_preemption_forks_and_an_abort_equals_plain(target, plain, lookahead):
    got = _run(target, MIX, forks=[(3, 0), (6, 3), (9, 4), (20, 6)], aborts=[(12, 7)], num_blocks=45,
               block_size=4, max_num_batched_tokens=64, admit_lookahead=lookahead)
    _same_as_plain(got, plain)
    eng = got[0]
    assert eng.stats.spec_drafts > 0 and eng.stats.preemptions > 0


def test_mixed_batch_with_eviction_equals_plain(target, plain):
    got = _run(target, MIX, forks=[(3, 0), (6, 3)], aborts=[(5, 6)], preemption="evict", num_blocks=50,
               block_size=4, max_num_batched_tokens=64)
    _same_as_plain(got, plain)
    assert got[0].stats.spec_drafts > 0 and got[0].stats.evictions > 0
