"""Speculative traces in a step above ``SpecConfig.max_batch`` decode plainly (the same tokens, no tree):
the engine says so once, naming the cap. The only sign was ``stats.spec_capped_steps``: 24 traces of
``pr`` at the default cap drafted not one tree, and tau read 0.00."""

from __future__ import annotations

import logging

from engine_util import drain, make_engine

from gambit.engine import SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


def _run(target, caplog, max_batch: int, n: int) -> tuple[list[str], object]:
    spec = SpecConfig(gamma=3, budget=6, max_batch=max_batch)
    eng = make_engine(target, block_size=8, num_blocks=256, spec=spec)
    eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
    with caplog.at_level(logging.WARNING, logger="gambit.engine.engine"):
        for p in PROMPTS[:n]:
            eng.add(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, decoding="pr"))
        drain(eng)
        eng.add(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, decoding="pr"))
        drain(eng)  # batch 1: trees again, and no second line
    return [r.getMessage() for r in caplog.records if r.name == "gambit.engine.engine"], eng.stats


def test_a_capped_step_is_said_once_naming_spec_max_batch(target, caplog):
    lines, stats = _run(target, caplog, max_batch=2, n=3)
    assert stats.spec_capped_steps >= 10 and stats.spec_drafts > 0
    assert len(lines) == 1, lines
    assert "a step of 3 traces" in lines[0] and "spec.max_batch = 2" in lines[0]


def test_nothing_is_said_without_a_capped_step(target, caplog):
    for max_batch, n in ((0, 3), (3, 3)):  # no cap; a batch at the cap
        caplog.clear()
        lines, stats = _run(target, caplog, max_batch=max_batch, n=n)
        assert stats.spec_capped_steps == 0 and stats.spec_drafts > 0 and lines == []
