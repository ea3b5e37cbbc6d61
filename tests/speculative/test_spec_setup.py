"""Speculative set-up errors come where the caller asks for a drafter, not from inside ``Engine.step``; the
drafting code reads the engine through public names only."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch
from spec_util import tiny_target

import gambit.speculative
from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.engine.sequence import Trace
from gambit.speculative import load_drafter, random_drafter, save_drafter
from gambit.speculative.decodings import DecodingUnavailable
from gambit.speculative.draft_state import context_tables
from gambit.speculative.drafter import DrafterMismatch


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


def test_a_drafter_tapping_layers_the_target_lacks_is_refused(tiny, tmp_path):
    """A drafter tapping layer 40 of a 6-layer target registered, and the first step holding its trace
    raised a bare ``KeyError: 40`` inside ``Engine.step``; now registration names the layers. Loaded from
    a folder, such a drafter is one made for another (deeper) target: ``DrafterMismatch``, so the
    services answer UNIMPLEMENTED as for another width (it was a plain ValueError, INVALID_ARGUMENT)."""
    eng = _engine(tiny, SpecConfig(max_batch=0))
    with pytest.raises(ValueError, match=r"taps target layers \[2, 3, 40\]; the target has 6 layers"):
        eng.register_drafter("x", random_drafter(eng.model, seed=1, target_taps=(2, 3, 40)))
    assert "x" not in eng.speculator().drafters
    assert eng.generate([[1, 5]], SamplingParams(temperature=0, max_tokens=3))  # the engine still serves
    deep, _ = tiny_target(layers=8)
    save_drafter(random_drafter(deep, seed=1, target_taps=(2, 4, 7)), tmp_path / "d")
    with pytest.raises(DrafterMismatch, match="outside the target's 6 layers"):
        load_drafter(tmp_path / "d", eng.model)
    with pytest.raises(DecodingUnavailable, match="outside the target's 6 layers"):
        eng.add([1, 5], SamplingParams(decoding=str(tmp_path / "d")))


def test_a_decoding_too_long_for_a_path_is_a_clear_error(tiny):
    """A decoding name longer than a file name may be raised ``OSError: [Errno 36] File name too long``
    from ``Engine.add`` (not the ValueError every other unknown decoding gives); now it is
    ``DecodingUnavailable`` naming the decoding, and nothing is queued."""
    eng = _engine(tiny, SpecConfig(max_batch=0))
    with pytest.raises(DecodingUnavailable, match=r"decoding 'xxx.*no drafter there \(File name too long"):
        eng.add([1, 5], SamplingParams(decoding="x" * 5000))
    assert not eng.traces


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


# the engine's private methods that verification still calls (the engine's own emit path: a stop ends
# the trace there too); nothing else private of the engine is read from the speculative package
ENGINE_PRIVATE_CALLED = {"_stop_reason", "_finish"}


def test_the_engine_is_read_through_public_names():
    """``drafting`` read the engine's private ``_told`` set and called ``_tell_once``; the engine now
    offers ``tell_once`` (which logs a key's note the first time only), and drafting calls that."""
    bad = []
    for f in sorted(Path(gambit.speculative.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")):
                continue
            on = node.value
            engine = (isinstance(on, ast.Name) and on.id in ("e", "engine")) or \
                (isinstance(on, ast.Attribute) and on.attr == "engine")
            if engine and node.attr not in ENGINE_PRIVATE_CALLED:
                bad.append(f"{f.name}:{node.lineno}: {node.attr}")
    assert not bad, bad


def test_tell_once_logs_a_key_once(tiny, caplog):
    eng = _engine(tiny, SpecConfig())
    with caplog.at_level(logging.WARNING, logger="gambit"):
        for n in (1, 2):
            eng.tell_once("probe", "note %d", n)
        eng.tell_once("other", "note %d", 3)
    assert [r.getMessage() for r in caplog.records] == ["note 1", "note 3"]
