"""The drafter's context pass builds its inputs with tensor ops (a prompt's thousands of positions cost
no Python loop a token) and reads exactly what the per-token lists said: the same token ids, RoPE
positions and tap-buffer rows, hence the same trees and the same greedy output."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from spec_util import tiny_target

from gambit.engine import Engine, EngineConfig, FinishedEvent, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import drafting, random_drafter
from gambit.speculative.draft_state import span_positions, span_slots


@pytest.fixture(scope="module")
def long_tiny():
    return tiny_target(layers=4, max_positions=1024)


def _engine(target, max_batch: int = 0) -> Engine:
    model, tok = target
    spec = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=max_batch)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=256))
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    return eng


def _prompts(tok) -> list[list[int]]:
    text = "Compute 12+345.\nSolution:\n12+345=357\n\n"
    return [tok.encode(text * 18)[:700], tok.encode(text), tok.encode("Compute 7+8.\n")]


@pytest.mark.parametrize("spans", [[(0, 700)], [(3, 7)], [(3, 7), (10, 12), (0, 1)], [(0, 300), (5, 9)],
                                   [(0, 130), (200, 330)]])
def testspan_positions_match_the_flat_lists(spans):
    want = [p for a, b in spans for p in range(a, b)]
    assert span_positions(spans, torch.device("cpu")).tolist() == want


@pytest.mark.parametrize("spans", [[(0, 700)], [(17, 18)], [(5, 40), (0, 3), (31, 33)], [(16, 48)]])
def testspan_slots_match_the_per_token_slots(spans):
    bs, g = 16, torch.Generator().manual_seed(0)
    ts = [SimpleNamespace(draft=SimpleNamespace(drafter_len=a), num_cached=b,
                          block_table=torch.randperm(500, generator=g)[:-(-b // bs) + 1].tolist())
          for a, b in spans]
    slots, ends = span_slots(ts, bs, torch.device("cpu"))
    want = [t.block_table[q // bs] * bs + q % bs
            for t in ts for q in range(t.draft.drafter_len, t.num_cached)]
    assert slots.tolist() == want
    assert ends == torch.tensor([b - a for a, b in spans]).cumsum(0).tolist()


def _run(eng, prompts, decoding, max_tokens=24, late: int = 0):
    """Greedy outputs; with ``late``, the last prompt arrives at that step (6 new tokens): a third trace
    over a cap of 2 makes capped steps, so the drafting traces' verified features get raw taps after."""
    def add(p, n):
        return eng.add(p, SamplingParams(temperature=0, decoding=decoding, max_tokens=n))

    ids = [add(p, max_tokens) for p in (prompts[:-1] if late else prompts)]
    fin = {}
    for step in range(2000):
        if late and step == late:
            ids.append(add(prompts[-1], 6))
        if not eng.has_unfinished() and step > late:
            break
        fin.update({e.trace_id: e for e in eng.step() if isinstance(e, FinishedEvent)})
    return [list(fin[i].output_ids) for i in ids]


@pytest.mark.parametrize("max_batch", [0, 2])
def test_context_pass_reads_what_per_token_lists_say(long_tiny, max_batch):
    """Batch 3 (a 700-token prompt beside short ones): each context pass feeds the drafter the ids and
    positions, and fuses the tap rows, that per-token lists built from the traces' state name; with a
    cap of 2 and a late third trace, verified features and raw taps mix. Greedy output equals plain."""
    prompts = _prompts(long_tiny[1])
    late = 8 if max_batch else 0
    plain = _run(_engine(long_tiny), prompts, "plain", late=late)
    eng = _engine(long_tiny, max_batch)
    spec = eng.speculator()
    seen = {"passes": 0, "raw_rows": 0, "mixed": False}
    original = spec._draft_group

    def checked(key, ts):
        d, bs = spec.drafters[key], eng.config.block_size
        want_ids = [x for t in ts for x in t.token_ids[t.draft.drafter_len + 1:t.num_cached + 1]]
        want_pos = [p for t in ts for p in range(t.draft.drafter_len, t.num_cached)]
        raw = [(t, t.draft.raw(t.num_cached)) for t in ts]
        seen["mixed"] |= any(t.draft.nfeat and r for t, r in raw)  # verified features, then raw taps
        slots = [t.block_table[q // bs] * bs + q % bs
                 for t, r in raw for q in range(t.num_cached - r, t.num_cached)]
        buf = spec._tap_buffer(d.config.target_taps)
        want_taps = buf[torch.tensor(slots, dtype=torch.long)].clone()
        got = {}
        fuse, forward = d.fuse, d.forward

        def spy_fuse(taps):
            got["taps"] = taps.clone()
            return fuse(taps)

        def spy_forward(ids, feats, pos, **kw):
            got["ids"], got["pos"] = ids[0].tolist(), pos[0].tolist()
            return forward(ids, feats, pos, **kw)

        d.fuse, d.forward = spy_fuse, spy_forward
        try:
            plan = original(key, ts)
        finally:
            del d.fuse, d.forward
        assert got["ids"] == want_ids and got["pos"] == want_pos
        if slots:
            assert torch.equal(got["taps"], want_taps)
        else:
            assert "taps" not in got
        seen["passes"] += 1
        seen["raw_rows"] += len(slots)
        return plan

    spec._draft_group = checked
    assert _run(eng, prompts, "pr", late=late) == plain
    assert seen["passes"] > 3 and seen["raw_rows"] >= 700 and seen["mixed"] == bool(max_batch)


def test_context_pass_builds_no_position_list(long_tiny, monkeypatch):
    """The first cycle's context pass spans the whole prompt: its items carry ranges, not a Python
    list a position (PagedAttention reads only their count; RoPE reads one arange)."""
    seen = []

    class Recording(drafting.PagedAttention):
        def __init__(self, cache, items, *a, **kw):
            seen.extend(it.positions for it in items)
            super().__init__(cache, items, *a, **kw)

    monkeypatch.setattr(drafting, "PagedAttention", Recording)
    eng = _engine(long_tiny)
    prompt = _prompts(long_tiny[1])[0]
    _run(eng, [prompt], "pr", max_tokens=4)
    assert seen and all(isinstance(p, range) for p in seen)
    assert len(seen[0]) == len(prompt) > 600
