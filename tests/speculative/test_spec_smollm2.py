"""Speculative decoding on the real checkpoint (SmolLM2-135M): a drafter over a reduced draft
vocabulary, at the width where one-row products stream, is lossless and runs its C++ forward."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative import random_drafter
from gambit.train.drafter_data import chat_prompts

SPEC = SpecConfig(gamma=3, budget=10, grow_width=3, offer_width=3, reconsider=2, max_batch=0)


@pytest.fixture(scope="module")
def engine(smollm2_folder):
    model, tok = load_model(smollm2_folder)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", block_size=16, num_blocks=128,
                                          spec=SPEC))
    drafters = {}
    for key, method in (("eagle", "eagle3.1"), ("pr", "pr")):
        vd = 1024
        d = random_drafter(eng.model, seed=3, method=method, draft_vocab_size=vd, std=0.05)
        ids = torch.arange(vd) * (model.config.vocab_size // vd)
        d.d2t.copy_(ids - torch.arange(vd))
        d.t2d.zero_()
        d.t2d[ids] = True
        eng.register_drafter(key, d)
        drafters[key] = d
    return eng, drafters


@pytest.mark.parametrize("method", ["eagle", "pr"])
def test_greedy_equals_plain_on_the_real_checkpoint(engine, smollm2_folder, method):
    engine, drafters = engine
    prompts = [engine.tokenizer.encode(p) for p in chat_prompts(str(smollm2_folder), ["What is 12 * 7?"])]
    prompts.append(engine.tokenizer.encode("The capital of France is"))
    plain = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    d0 = engine.stats.spec_drafts
    for p, ref in zip(prompts, plain, strict=True):  # batch 1: the drafter's one-row calls
        out = engine.generate([p], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                  decoding=method))[0]
        assert out == ref
    assert engine.stats.spec_drafts > d0
    assert drafters[method].fast_forward is not None  # the C++ drafter forward served it
