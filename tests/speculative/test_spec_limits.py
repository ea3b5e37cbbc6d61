"""Speculative decoding at its limits: a drafter's RoPE table shorter than the target's context, and
the acceptance counters (stats.tau) when a stop cuts an accepted path."""

from __future__ import annotations

import pytest
import torch

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig
from gambit.speculative import random_drafter
from gambit.tasks.arithmetic import TaskConfig, generate

SPEC = SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, max_batch=0)


def _engine(target, **kw) -> Engine:
    model, tok = target
    kw.setdefault("num_blocks", 512)
    return Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=SPEC, **kw))


def _prompts(tok, n=3) -> list[list[int]]:
    return [tok.encode(p.prompt) for p in generate("test", n, 3, TaskConfig(2, 6))]


@pytest.mark.parametrize("cpu_kernel", [False, True])
def test_drafter_rope_table_shorter_than_the_context(target, cpu_kernel):
    """A drafter whose max_position_embeddings is below the target's context (public EAGLE-3 configs say
    2048; SmolLM2's context is 8192): past its table the Python path raised IndexError inside
    Engine.step (every trace failed) and the C++ path read past the table. RoPE is a formula: register
    builds the table for the context, so the short drafter drafts as one built with the long table."""
    eng = _engine(target, cpu_kernel=cpu_kernel)
    ctx = eng.max_model_len
    assert ctx > 64
    eng.register_drafter("short", random_drafter(eng.model, seed=5, method="pr", max_position_embeddings=64))
    eng.register_drafter("long", random_drafter(eng.model, seed=5, method="pr"))
    spec = eng.speculator()
    short, long = spec.drafters["short"], spec.drafters["long"]
    assert short.config.max_position_embeddings == 64  # the checkpoint's config is not rewritten
    assert short.rope.cos.shape[0] == long.rope.cos.shape[0] == ctx
    assert torch.equal(short.rope.cos, long.rope.cos) and torch.equal(short.rope.sin, long.rope.sin)
    p = sum(_prompts(target[1]), [])[:100]  # drafts at positions 100..: past the short table
    ref = eng.generate([p], SamplingParams(temperature=0, max_tokens=20))[0]
    got = {}
    for name in ("short", "long"):
        before = (eng.stats.spec_drafts, eng.stats.spec_accepted)
        assert eng.generate([p], SamplingParams(temperature=0, max_tokens=20, decoding=name))[0] == ref
        got[name] = (eng.stats.spec_drafts - before[0], eng.stats.spec_accepted - before[1])
    assert got["short"] == got["long"] and got["short"][0] > 0  # the same drafts, cycle for cycle


def test_cpp_drafter_refuses_a_position_past_its_rope_table(target):
    """The C++ forward (context pass and tree steps) read ``cos_t + pos * D`` with no bound: past the
    table it read other memory, silently. A table left short (register sizes it for the context) now
    raises, naming the position and the table's length, as PyTorch's indexing does."""
    from gambit.engine import cpu_attention

    if cpu_attention.kernel() is None:
        pytest.skip("no C++ kernels here")
    eng = _engine(target)
    eng.register_drafter("pr", random_drafter(eng.model, seed=5, method="pr"))
    d = eng.speculator().drafters["pr"]
    assert d.fast_forward is not None  # the C++ path serves it
    d.rope.cos, d.rope.sin = d.rope.cos[:64], d.rope.sin[:64]
    p = sum(_prompts(target[1]), [])[:100]
    with pytest.raises(RuntimeError, match=r"drafter RoPE position \d+ outside its table of 64 rows"):
        eng.generate([p], SamplingParams(temperature=0, max_tokens=4, decoding="pr"))


@pytest.mark.parametrize("kw", [dict(max_tokens=2), dict(max_tokens=60, stop=["="])],
                         ids=["max_tokens=2", "stop"])
def test_tau_counts_only_emitted_tokens(target, kw):
    """stats.tau is "tokens emitted per verification forward": accepted draft tokens cut by a stop
    (max_tokens, a stop string, EOS) are not emitted and must not count (spec_by_decoding likewise):
    max_tokens=2 read tau 5.00 where each trace's tau was 1.00."""
    eng = _engine(target, batch_invariant=True)
    ids = [eng.add(p, SamplingParams(temperature=0, decoding="pr", **kw)) for p in _prompts(target[1], 4)]
    while eng.has_unfinished():
        eng.step()
    s = eng.stats
    emitted = s.generated_tokens - len(ids)  # each trace's first token comes from its prefill
    assert s.spec_drafts > 0
    assert s.spec_accepted + s.spec_drafts == emitted
    assert s.spec_by_decoding["pr"][2] == s.spec_accepted
    per_trace = [s.trace_tau[i] for i in ids]
    assert s.tau == pytest.approx(emitted / s.spec_drafts)
    if "stop" not in kw:  # max_tokens=2: one cycle each, cut after its first token
        assert per_trace == [1.0] * 4 and s.tau == 1.0
