"""Speculative set-up errors come where the caller asks for a drafter, not from inside ``Engine.step``; the
drafting code reads the engine through public names only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import gambit.speculative
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.engine.sequence import Trace
from gambit.speculative import random_drafter
from gambit.speculative.draft_state import context_tables


def _engine(tiny, spec: SpecConfig) -> Engine:
    model, tok = tiny
    return Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=64))


def test_a_budget_above_the_drafters_tree_is_refused_at_registration(tiny):
    """B = 8 fits PR's tree (m = 1: 2 + 2 x 3 = 8 candidates) but not EAGLE-3.1's (m = 0: 6). The EAGLE
    drafter registered, and the first step of any batch holding one of its traces raised "budget 8
    exceeds the 6 candidates" from ``TreeConfig`` inside ``Engine.step``; now registration says so."""
    spec = SpecConfig(gamma=2, budget=8, grow_width=1, offer_width=2, reconsider=1, max_batch=0)
    eng = _engine(tiny, spec)
    eng.register_drafter("pr", random_drafter(eng.model, seed=1, method="pr"))
    with pytest.raises(ValueError, match=r"drafter 'e' cannot draft .*budget 8 exceeds the 6 candidates"):
        eng.register_drafter("e", random_drafter(eng.model, seed=1, method="eagle3.1"))
    assert "e" not in eng.speculator().drafters
    p = SamplingParams(temperature=0, max_tokens=8)
    want = eng.generate([[1, 5, 6]], p)
    assert eng.generate([[1, 5, 6]], SamplingParams(temperature=0, max_tokens=8, decoding="pr")) == want
    assert eng.stats.spec_drafts > 0


def test_an_offer_wider_than_the_draft_vocabulary_is_refused_at_registration(tiny):
    """Each row offers its top-k draft tokens: k = 6 over a 4-token draft vocabulary raised "selected
    index k out of range" inside ``Engine.step`` (both the C++ and the Python tree)."""
    eng = _engine(tiny, SpecConfig(gamma=2, budget=8, grow_width=2, offer_width=6, reconsider=0, max_batch=0))
    with pytest.raises(ValueError, match="offer_width=6 exceeds its draft vocabulary of 4 tokens"):
        eng.register_drafter("small", random_drafter(eng.model, seed=1, draft_vocab_size=4))
    assert eng.generate([[1, 5]], SamplingParams(temperature=0, max_tokens=3))  # the engine still serves


def test_context_tables_cover_the_longest_context():
    """The tree steps' dense context: every table cut or zero-padded to the blocks of the longest
    context (``num_cached``); a tree's blocks past it are left out."""
    a, b = Trace(0, [1] * 3, 3, SamplingParams(), 0), Trace(1, [1] * 40, 40, SamplingParams(), 0)
    a.block_table, a.num_cached = [5], 3
    b.block_table, b.num_cached = [1, 2, 4, 6], 33  # block 6 holds a tree's nodes
    got = context_tables([a, b], 16, torch.device("cpu"))
    assert got.tolist() == [[5, 0, 0], [1, 2, 4]] and got.dtype == torch.long
    b.num_cached = 32
    assert context_tables([b, a], 16, torch.device("cpu")).tolist() == [[1, 2], [5, 0]]


def test_no_private_names_imported_from_other_packages():
    """``drafting`` imported ``gambit.engine.attention._padded_tables``: a private helper that the engine
    may change or drop. The speculative package now imports only public names from other packages."""
    bad = []
    for f in sorted(Path(gambit.speculative.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gambit.") \
                    and not node.module.startswith("gambit.speculative"):
                bad += [f"{f.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not bad, bad
