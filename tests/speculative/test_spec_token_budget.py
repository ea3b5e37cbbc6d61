"""Draft trees count against the step's token budget (``max_num_batched_tokens``): the scheduler counts
one row a decoding trace, a tree feeds 1 + B. Trees go to the batch's first traces while the rows
left after the step's other rows last; the rest decode plainly that step (the same tokens)."""

from __future__ import annotations

import logging

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter

B = 4
SPEC = SpecConfig(gamma=2, budget=B, grow_width=1, offer_width=2, reconsider=1, max_batch=0)
PROMPTS = [[5, 9, 11, 7], [3, 4, 8], [6, 6, 2, 9, 1], [12, 10]]


def _engine(tiny, tokens: int) -> Engine:
    model, tok = tiny
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", num_blocks=64, block_size=4,
                                          max_num_batched_tokens=tokens, spec=SPEC))
    eng.register_drafter("pr", random_drafter(eng.model, seed=3, method="pr"))
    return eng


def _run(eng: Engine, decoding: str) -> tuple[list[list[int]], list[int]]:
    """Outputs, and the rows of every step's forward."""
    rows, forward = [], eng.runner.forward

    def counted(items, *a, **kw):
        rows.append(sum(it.q for it in items))
        return forward(items, *a, **kw)

    eng.runner.forward = counted
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, decoding=decoding)
    return eng.generate(PROMPTS, params), rows


def test_trees_fit_the_step_token_budget(tiny, caplog):
    """4 decoding traces, B = 4, a budget of 4 + 2 * 4 = 12 rows: at most two trees a step (before: all
    four, 20 rows against a budget of 12), and the tokens of plain decoding."""
    tokens = len(PROMPTS) + 2 * B
    ref, _ = _run(_engine(tiny, tokens), "plain")
    eng = _engine(tiny, tokens)
    sizes, group = [], eng.speculator()._draft_group

    def wrapped(key, ts):
        sizes.append(len(ts))
        return group(key, ts)

    eng.speculator()._draft_group = wrapped
    with caplog.at_level(logging.WARNING, logger="gambit"):
        out, rows = _run(eng, "pr")
    assert out == ref
    assert max(rows) <= tokens, rows
    assert sizes and max(sizes) == 2 and eng.stats.spec_drafts > 0
    assert sum("max_num_batched_tokens = 12" in r.getMessage() for r in caplog.records) == 1  # told once
    assert eng.blocks.num_free == eng.num_blocks


def test_a_budget_below_one_tree_decodes_plainly(tiny):
    """A budget below 1 + B rows: no tree ever fits; every trace decodes plainly, the same tokens."""
    ref, _ = _run(_engine(tiny, B), "plain")
    eng = _engine(tiny, B)
    out, rows = _run(eng, "pr")
    assert out == ref
    assert max(rows) <= B and eng.stats.spec_drafts == 0, rows
