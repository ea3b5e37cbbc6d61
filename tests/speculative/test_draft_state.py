"""A trace's pending drafter inputs: counted per step, raw taps in the paged tap buffer at the rows' KV
slots (what the target computed for those positions), copied with a fork's partial block."""

from __future__ import annotations

import pytest
import torch
from spec_util import SHIPPED

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative import random_drafter
from gambit.speculative.decoder import DraftState


@pytest.fixture(scope="module")
def target():
    return load_model(SHIPPED, device="cpu", dtype="float32")


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
    st = DraftState("pr")
    st.set_feats([torch.randn(5, 8)])  # a verified feature chunk (width H = 8)
    assert (st.pending, st.raw) == (5, 0)
    st.pending, st.raw = st.pending + 3, 3  # what ``store`` does for three plain rows
    child = st.clone()
    assert (child.pending, child.raw, child.drafter_len) == (8, 3, 0) and child.feats == st.feats
    assert child.feats is not st.feats and (child.cycles, child.emitted) == (0, 0)
    st.set_feats([])
    assert (st.pending, st.raw) == (0, 0)


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
        st = t.draft
        assert st.drafter_len == 0 and st.feats == [] and st.pending == st.raw == t.num_cached
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
    assert child.draft.raw == parent.draft.raw == parent.num_cached
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
