"""Stop strings longer than the fixed 64-token tail the engine decoded to look for them."""

from __future__ import annotations

from engine_util import drain, make_engine, tiny_model

from gambit.engine.events import FinishedEvent
from gambit.engine.sequence import SamplingParams


def _finished(engine, params: SamplingParams) -> FinishedEvent:
    engine.add("hello", params)
    return next(e for e in drain(engine) if isinstance(e, FinishedEvent))


def test_a_stop_string_longer_than_64_tokens_stops():
    """An 80-character stop string over a char tokenizer (80 tokens) never matched: the trace ran to
    max_tokens. It stops at the token that completes it, as a short one does."""
    engine = make_engine(tiny_model(), num_blocks=64, block_size=4)
    base = SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)
    free = engine.blocks.num_free
    out = list(_finished(engine, base).output_ids)
    text = engine.tokenizer.decode(out)
    stop = text[10:90]
    assert len(stop) == 80
    # the token that completes its first occurrence
    first = next(k for k in range(len(out) + 1) if stop in engine.tokenizer.decode(out[:k]))
    ev = _finished(engine, SamplingParams(temperature=0, max_tokens=150, ignore_eos=True, stop=stop))
    assert ev.reason == "stop"
    assert list(ev.output_ids) == out[:first]
    assert engine.blocks.num_free == free
