"""A trace's unread drafter inputs: verified features with its state, then raw taps in the paged tap
buffer at the rows' KV slots (what the target computed for those positions, written for every fed row,
so their count follows from ``num_cached``), copied with a fork's partial block; the state is made at a
trace's first draft and dropped with its KV."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter
from gambit.speculative.draft_state import DraftState


def _capped_engine(target) -> Engine:
    model, tok = target
    spec = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=1)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=256))
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    return eng


def _slots(eng, t, positions) -> list[int]:
    bs = eng.config.block_size
    return [t.block_table[p // bs] * bs + p % bs for p in positions]


def test_state_counts_and_clone():
    st = DraftState("pr", drafter_len=10)
    st.set_feats([torch.randn(5, 8)])  # a verified feature chunk (width H = 8): positions 10..14
    assert st.nfeat == 5 and st.raw(15) == 0
    assert st.raw(18) == 3  # three rows fed the plain way since: raw taps
    child = st.clone()
    assert (child.nfeat, child.raw(18), child.drafter_len) == (5, 3, 10) and child.feats == st.feats
    assert child.feats is not st.feats and (child.cycles, child.emitted) == (0, 0)
    st.set_feats([])
    assert st.nfeat == 0 and st.raw(18) == 8


def test_capped_steps_write_the_targets_taps_at_the_rows_slots(target):
    """Three traces over a cap of one: every step is plain; each trace's unread positions are all raw,
    and the buffer holds, at their KV slots, the taps a fresh full-sequence forward computes."""
    model, tok = target
    eng = _capped_engine(target)
    prompts = [tok.encode(f"Compute {a}+{b}.\nSolution:\n") for a, b in ((1, 2), (30, 4), (5, 67))]
    ids = [eng.add(p, SamplingParams(temperature=0, decoding="pr", max_tokens=30)) for p in prompts]
    for _ in range(12):
        eng.step()
    assert eng.stats.spec_drafts == 0 and eng.stats.spec_capped_steps >= 12
    spec = eng.speculator()
    layers = spec.drafters["pr"].config.target_taps
    buf = spec.tap_buffers[layers]
    assert list(spec.tap_buffers) == [layers]
    for tid in ids:
        t = eng.traces[tid]
        assert t.draft is None  # no state until the trace drafts: all its cached positions are raw
        got = buf[_slots(eng, t, range(t.num_cached))]
        toks = torch.tensor(t.token_ids[:t.num_cached])[None]
        with torch.inference_mode():
            _, taps = model(toks, torch.arange(t.num_cached)[None], taps=layers)
        want = torch.cat([taps[i][0] for i in layers], dim=-1)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_fork_copies_the_partial_blocks_raw_taps(target):
    model, tok = target
    eng = _capped_engine(target)
    a = eng.add(tok.encode("Compute 12+34.\nSolution:\n"), SamplingParams(temperature=0, decoding="pr",
                                                                         max_tokens=40))
    b = eng.add(tok.encode("Compute 5+6.\nSolution:\n"), SamplingParams(temperature=0, decoding="pr",
                                                                       max_tokens=40))
    for _ in range(5):
        eng.step()
    parent = eng.traces[a]
    bs = eng.config.block_size
    assert parent.num_cached % bs, "the fork must have a partial block to copy"
    (c,) = eng.fork(a, 1)
    child = eng.traces[c]
    assert child.draft is None and parent.draft is None  # never drafted: every position raw
    buf = eng.speculator().tap_buffers[eng.speculator().drafters["pr"].config.target_taps]
    pos = range(parent.num_cached)
    assert _slots(eng, child, pos) != _slots(eng, parent, pos)  # its own last block
    assert torch.equal(buf[_slots(eng, child, pos)], buf[_slots(eng, parent, pos)])
    assert b in eng.traces


def test_token_events_drafted_only_in_steps_with_trees(target):
    """``step(token_events="drafted")`` (what the search driver asks for speculative runs): the same
    generation, no TokenEvent in capped steps, and in the steps that verified trees exactly the events
    ``token_events=True`` gives."""
    from gambit.engine import FinishedEvent, TokenEvent

    model, tok = target
    prompts = [tok.encode(f"Compute {a}+{b}.\nSolution:\n") for a, b in ((1, 2), (30, 4), (5, 67))]
    got = {}
    for mode in (True, "drafted"):
        eng = _capped_engine(target)
        ids = [eng.add(p, SamplingParams(temperature=0.7, seed=i, decoding="pr", max_tokens=12 + 10 * i))
               for i, p in enumerate(prompts)]
        per_step, outs = [], {}
        for _ in range(500):
            if not eng.has_unfinished():
                break
            before = eng.stats.spec_drafts
            evs = eng.step(token_events=mode)
            outs.update({e.trace_id: e.output_ids for e in evs if isinstance(e, FinishedEvent)})
            toks = [(e.trace_id, e.token_id, e.position) for e in evs if isinstance(e, TokenEvent)]
            per_step.append((eng.stats.spec_drafts > before, toks))
        got[mode] = ([outs[i] for i in ids], per_step)
        assert eng.stats.spec_drafts > 0 and eng.stats.spec_capped_steps > 0  # both kinds of step
    (out_a, steps_a), (out_b, steps_b) = got[True], got["drafted"]
    assert out_a == out_b and len(steps_a) == len(steps_b)
    for (drafted, ev_a), (_, ev_b) in zip(steps_a, steps_b, strict=True):
        assert ev_b == (ev_a if drafted else [])
    with pytest.raises(ValueError, match="token_events"):
        _capped_engine(target).step(token_events="sometimes")


def test_a_trace_that_drafted_then_took_capped_steps_reads_its_whole_context(target):
    """Drafted (verified features), then capped (raw taps, no state touched), then preempted (state
    dropped with the KV) and re-prefilled: each time the drafter's unread inputs are the fused taps a
    fresh full-sequence forward computes at exactly the positions it has not read."""
    model, tok = target
    eng = _capped_engine(target)
    spec = eng.speculator()
    d = spec.drafters["pr"]
    a = eng.add(tok.encode("Compute 12+34*5.\nSolution:\n"), SamplingParams(temperature=0, decoding="pr",
                                                                           max_tokens=200))
    for _ in range(3):
        eng.step()
    t = eng.traces[a]
    assert eng.stats.spec_drafts > 0 and t.draft is not None and t.draft.nfeat > 0  # drafted alone

    def check_unread() -> None:
        st, N = t.draft if t.draft is not None else spec._state(t), t.num_cached
        got = spec._group_features(d, [t])
        toks = torch.tensor(t.token_ids[:N])[None]
        with torch.inference_mode():
            _, taps = model(toks, torch.arange(N)[None], taps=d.config.target_taps)
            want = d.fuse(torch.cat([taps[i][0] for i in d.config.target_taps], dim=-1))[st.drafter_len:]
        assert got.shape == want.shape == (N - st.drafter_len, d.config.hidden_size)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    b = eng.add(tok.encode("Compute 5+6.\nSolution:\n"), SamplingParams(temperature=0, decoding="pr",
                                                                       max_tokens=200))
    drafts, nfeat = eng.stats.spec_drafts, t.draft.nfeat
    for _ in range(4):  # two traces over a cap of one: plain steps
        eng.step()
    assert eng.stats.spec_drafts == drafts and t.draft.nfeat == nfeat and t.draft.raw(t.num_cached) >= 4
    check_unread()
    eng.scheduler.remove(t)  # what a recompute preemption does (``Scheduler._release``)
    eng.blocks.free(t)
    eng.scheduler.add(t)
    assert t.draft is None and t.num_cached == 0
    eng.abort(b)
    drafts = eng.stats.spec_drafts
    eng.step()  # the re-prefill: its rows' taps written, no draft yet
    assert eng.stats.spec_drafts == drafts and t.draft is None and t.num_cached == len(t.token_ids) - 1
    check_unread()  # the fresh state reads every position
    eng.step()
    assert eng.stats.spec_drafts > drafts  # and drafts from it
