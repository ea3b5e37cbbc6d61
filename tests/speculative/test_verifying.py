"""Verification in the engine at the sampler's edges: ``verify="rejection"`` emits what plain decoding
does wherever plain sampling is deterministic (a temperature whose scaled logits overflow)."""

from __future__ import annotations

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter

SPEC = SpecConfig(gamma=3, budget=8, grow_width=2, offer_width=3, reconsider=1, verify="rejection",
                  max_batch=0)


def _run(tiny, decoding: str, **kw) -> tuple[list[list[int]], Engine]:
    model, tok = tiny
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", num_blocks=128, block_size=4,
                                          spec=SPEC))
    eng.register_drafter("pr", random_drafter(eng.model, seed=3, method="pr", std=0.5))
    prompts = [tok.encode("Compute 12+7.\n"), tok.encode("abc")]
    params = [SamplingParams(decoding=decoding, seed=i, max_tokens=16, ignore_eos=True, **kw)
              for i in range(len(prompts))]
    out = eng.generate(prompts, params)
    assert eng.blocks.num_free == eng.num_blocks
    return out, eng


def test_rejection_at_a_temperature_that_overflows_equals_plain(tiny):
    """T = 1e-39: logits / T overflow to +inf, and plain sampling takes the argmax (greedy's tokens).
    Rejection verification emitted token 0 after the first token instead (NaN target probabilities)."""
    greedy, _ = _run(tiny, "plain", temperature=0)
    plain, _ = _run(tiny, "plain", temperature=1e-39)
    spec, eng = _run(tiny, "pr", temperature=1e-39)
    assert plain == greedy
    assert spec == plain and eng.stats.spec_drafts > 0
