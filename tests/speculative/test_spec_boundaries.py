"""Thought boundaries under speculative decoding: eagle3.1 and pr give the very ``BoundaryEvent`` s of
plain decoding (positions, and states bit for bit under ``batch_invariant``), also where a boundary is
two tokens, ``"\\n"`` then ``"\\n"``, as byte-level BPE writes most paragraph breaks. Such a pair's
second token is either a tree's root (checked in ``BoundaryDetector.tree_events``, against token N - 1)
or an accepted draft node (checked in ``SpecDecoder`` with the detector's full rule)."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import BoundaryEvent, Engine, EngineConfig, FinishedEvent, SamplingParams
from gambit.engine.boundary import BoundaryDetector
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative import random_drafter
from gambit.tasks.arithmetic import TaskConfig, generate

SPEC = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=0)


class _TwoTokenRule:
    """The char tokenizer with "=" as a token ending in one newline and digits as tokens starting with
    one: the engine's two-token rule (BPE's "\\n", "\\n") fires on tokens the shipped model writes, and
    the shipped drafters (high acceptance) put many of them on accepted nodes."""

    def __init__(self, tok):
        self.boundary_ids, self.vocab_size = tok.boundary_ids, tok.vocab_size
        self.newline_end_ids = frozenset(tok.newline_end_ids) | {tok.encode("=")[-1]}
        digits = {tok.encode(str(d))[-1] for d in range(10)}
        self.newline_start_ids = frozenset(tok.newline_start_ids) | digits


def _boundaries(eng: Engine, prompts: list[list[int]], sp: SamplingParams) -> list[list[tuple]]:
    """Per prompt: its (position, state) boundary events."""
    ids = [eng.add(p, sp) for p in prompts]
    ev = []
    while eng.has_unfinished():
        ev += eng.step()
    return [[(e.position, e.hidden) for e in ev if isinstance(e, BoundaryEvent) and e.trace_id == t]
            for t in ids]


def _assert_same(plain: list[list[tuple]], spec: list[list[tuple]]) -> None:
    assert [[p for p, _ in x] for x in spec] == [[p for p, _ in x] for x in plain]
    for (p, a), (_, b) in zip(sum(plain, []), sum(spec, []), strict=True):
        assert torch.equal(a, b), f"state at position {p}"


@pytest.mark.parametrize("decoding", ["eagle3.1", "pr"])
def test_two_token_boundaries_at_plain_positions(target, decoding):
    """Roots paired with their real predecessor, accepted nodes with the two-token rule too: before,
    eagle3.1 gave [46, 47, 54, ...] (46, 54 spurious, 39 and 45 lost) where plain gave [39, 45, 47, ...]."""
    model, tok = target
    prompts = [tok.encode(p.prompt) for p in generate("test", 3, 3, TaskConfig(2, 6))]
    got = []
    for d in ("plain", decoding):
        eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", num_blocks=512, spec=SPEC,
                                              batch_invariant=True))
        eng.boundary = BoundaryDetector(_TwoTokenRule(tok), model.config.vocab_size, eng.device)
        got.append(_boundaries(eng, prompts, SamplingParams(temperature=0, max_tokens=60, decoding=d)))
        if d != "plain":
            assert eng.stats.spec_accepted > eng.stats.spec_drafts  # accepted nodes, not only roots
    plain, spec = got
    assert sum(map(len, plain)) > 20  # the two-token rule fired
    _assert_same(plain, spec)


def test_paragraph_breaks_on_the_real_checkpoint(smollm2_folder):
    """SmolLM2 writes a paragraph break as "\\n", "\\n": with random drafters (nearly nothing accepted)
    almost every token is a tree root, and before the fix such breaks were lost (plain: [68], pr: []).
    One batch (plain rows beside trees); batch_invariant keeps each trace's states its own."""
    model, tok = load_model(smollm2_folder)
    spec = SpecConfig(gamma=3, budget=10, grow_width=3, offer_width=3, reconsider=2, max_batch=0)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", num_blocks=64, spec=spec,
                                          batch_invariant=True))
    vd = 1024
    for method in ("eagle3.1", "pr"):
        dr = random_drafter(eng.model, seed=3, method=method, draft_vocab_size=vd, std=0.05)
        ids = torch.arange(vd) * (model.config.vocab_size // vd)
        dr.d2t.copy_(ids - torch.arange(vd))
        dr.t2d.zero_()
        dr.t2d[ids] = True
        eng.register_drafter(f"random-{method}", dr)
    prompt = tok.encode("Write two short paragraphs about cats, separated by a blank line.\n\nCats")
    got = [eng.add(prompt, SamplingParams(temperature=0, max_tokens=56, decoding=d))
           for d in ("plain", "random-eagle3.1", "random-pr")]
    ev = []
    while eng.has_unfinished():
        ev += eng.step()
    assert eng.stats.spec_drafts > 40
    out = {e.trace_id: prompt + list(e.output_ids) for e in ev if isinstance(e, FinishedEvent)}
    bnd = {t: [(e.position, e.hidden) for e in ev if isinstance(e, BoundaryEvent) and e.trace_id == t]
           for t in got}
    plain, seq = bnd[got[0]], out[got[0]]
    assert plain  # a paragraph break, written as "\\n" then "\\n"
    assert all(tok.decode(seq[p - 1:p + 1]) == "\n\n" and seq[p] not in tok.boundary_ids for p, _ in plain)
    for t in got[1:]:
        assert out[t] == seq
        _assert_same([plain], [bnd[t]])
