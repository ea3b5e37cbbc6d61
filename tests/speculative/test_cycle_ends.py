"""Why cycles end (``speculative.cycle_ends``): every verified cycle classified, consistent with τ,
the tree's depth and the drafter's own offer."""

from __future__ import annotations

from dataclasses import replace

import pytest
from spec_util import SHIPPED

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative.cycle_ends import KINDS, summarise
from gambit.tasks.arithmetic import TaskConfig, generate

PAPER = SpecConfig(gamma=8, budget=48, grow_width=6, offer_width=6, reconsider=3, max_batch=0)


@pytest.mark.parametrize("method,m", [("eagle3.1", 0), ("pr", 3)])
def test_every_cycle_end_is_classified_consistently(method, m):
    model, tok = load_model(SHIPPED, device="cpu", dtype="float32")
    spec = replace(PAPER, reconsider=m)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec))
    dec = eng.speculator()
    dec.records, dec.cycle_ends = [], []
    prompts = [tok.encode(p.prompt) for p in generate("test", 3, 5, TaskConfig(4, 8))]
    eng.generate(prompts, SamplingParams(temperature=0, max_tokens=64, decoding=method))
    ends = dec.cycle_ends
    assert len(ends) == eng.stats.spec_drafts > 0
    deepest = spec.gamma + 1
    # the verifier's accepted counts; stats count the emitted ones: max_tokens cuts each trace's last cycle
    cut = sum(e["accepted"] for e in ends) - eng.stats.spec_accepted
    assert 0 <= cut <= len(prompts) * deepest
    assert eng.stats.spec_accepted + eng.stats.spec_drafts == eng.stats.generated_tokens - len(prompts)
    for e in ends:
        assert e["kind"] in KINDS
        # a node at the deepest level never grows, and only such a node stops a cycle that deep
        assert (e["kind"] == "depth cap") == (e["accepted"] == deepest), e
        if e["kind"] == "outside top-k" and e["rank"] is not None:
            assert e["rank"] >= spec.offer_width, e  # the target's token was not among the k offered
    s = summarise(ends, spec.offer_width)
    assert abs(sum(s["share"].values()) - 1) < 1e-9
    # a well-trained drafter on its own target: most cycles run deep, and some stop at the cap
    assert s["share"]["depth cap"] > 0.1
