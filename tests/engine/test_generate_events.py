"""``Engine.generate`` beside a caller that streams other traces (``add`` + ``step``): it consumes only
its own traces' events. It used to eat every event of the step, so a streamed trace's tokens and its
FinishedEvent never reached the caller, and a loop waiting for that FinishedEvent waited forever."""

from __future__ import annotations

from engine_util import drain, make_engine

from gambit.engine import FinishedEvent, SamplingParams, TokenEvent

STREAMED, OTHER = [5, 6, 7], [8, 9, 10]


def _engine(tiny):
    return make_engine(tiny, block_size=4, num_blocks=64)


def _check_stream(events, tid: int, prompt_len: int, ref: list[int], reason: str) -> None:
    """The streamed trace's events: contiguous token positions, then one FinishedEvent with those tokens."""
    mine = [e for e in events if e.trace_id == tid]
    tokens = [e for e in mine if isinstance(e, TokenEvent)]
    assert [e.position for e in tokens] == list(range(prompt_len, prompt_len + len(tokens)))
    assert isinstance(mine[-1], FinishedEvent) and mine[-1].reason == reason
    assert [e for e in mine if isinstance(e, FinishedEvent)] == [mine[-1]]
    assert [e.token_id for e in tokens] == list(mine[-1].output_ids) == ref[:len(tokens)]


def test_a_streamed_trace_that_ends_inside_generate_keeps_its_events(tiny):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = _engine(tiny).generate([STREAMED], params)[0]
    eng = _engine(tiny)
    tid = eng.add(STREAMED, params)
    seen = eng.step()  # the caller streams it ...
    gen = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    out = eng.generate([OTHER], gen)  # ... and runs a prompt to completion meanwhile
    assert out == _engine(tiny).generate([OTHER], gen)
    assert eng.has_unfinished()  # the streamed trace's events wait for the caller
    seen += drain(eng)
    assert {e.trace_id for e in seen} == {tid}  # generate's own trace's events stay inside it
    _check_stream(seen, tid, len(STREAMED), ref, "length")
    assert eng.stats.finished == 2 and eng.blocks.num_free == eng.num_blocks


def test_events_kept_by_generate_come_before_a_later_abort(tiny):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ref = _engine(tiny).generate([STREAMED], params)[0]
    eng = _engine(tiny)
    tid = eng.add(STREAMED, params)
    seen = eng.step()
    eng.generate([OTHER], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert eng.get(tid).num_generated > 1  # still live: it decoded beside generate's trace
    eng.abort(tid)
    seen += eng.step()  # what generate kept, in order, then the abort's FinishedEvent
    _check_stream(seen, tid, len(STREAMED), ref, "abort")
    assert not eng.has_unfinished() and eng.blocks.num_free == eng.num_blocks
