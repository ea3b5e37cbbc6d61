"""Arguments of the wrong type are a ValueError naming the argument, the engine unchanged: True passed
as the integer 1 (a token id, ``fork``'s n, a priority), "2" as a priority, bytes as token ids, and
``generate`` left the prompts before a bad one queued."""

from __future__ import annotations

import pytest
from engine_util import drain, make_engine

from gambit.engine import EngineConfig, SamplingParams
from gambit.engine.config import SpecConfig

GOOD = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture
def eng(tiny):
    return make_engine(tiny, block_size=4, num_blocks=64)


def _unchanged(eng, n_traces: int = 0) -> None:
    assert len(eng.traces) == n_traces and eng._next_id == n_traces and eng.stats.forks == 0
    assert len(eng.scheduler.waiting) + len(eng.scheduler.running) == n_traces


@pytest.mark.parametrize("prompt, match", [
    ([3, True], "token ids"), ([False], "token ids"), (b"ab", "^prompt must be a string or a sequence"),
    (5, "^prompt must be a string or a sequence"), (None, "^prompt must be a string or a sequence"),
], ids=["true-id", "false-id", "bytes", "int", "none"])
def test_prompts_of_the_wrong_type(eng, prompt, match):
    with pytest.raises(ValueError, match=match):
        eng.add(prompt, GOOD)
    _unchanged(eng)


@pytest.mark.parametrize("priority", [True, False, "2", b"1"])
def test_priority_of_the_wrong_type(eng, priority):
    with pytest.raises(ValueError, match="^priority must be a number"):
        eng.add([3, 4], GOOD, priority=priority)
    _unchanged(eng)
    tid = eng.add([3, 4], GOOD, priority=2)  # an int or a float is fine
    with pytest.raises(ValueError, match="^priority must be a number"):
        eng.set_priority(tid, priority)
    with pytest.raises(ValueError, match="^priority must be a number"):
        eng.fork(tid, 1, priority=priority)
    assert eng.get(tid).priority == 2.0 and len(eng.traces) == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"n": True}, "^n must be an integer"), ({"n": 2.0}, "^n must be an integer"),
    ({"n": 1, "seeds": 7}, "^seeds must be a list of 1 values, got int"),
    ({"n": 1, "temperatures": 0.5}, "^temperatures must be a list of 1 values, got float"),
    ({"n": 1, "seeds": "7"}, "^seeds must be a list"),
])
def test_fork_arguments_of_the_wrong_type(eng, kwargs, match):
    tid = eng.add([5, 6, 7], GOOD)
    eng.step()
    with pytest.raises(ValueError, match=match):
        eng.fork(tid, **kwargs)
    _unchanged(eng, 1)
    assert len(eng.fork(tid, 1)) == 1


def test_generate_checks_every_prompt_before_queueing_any(eng):
    """A bad prompt (or too few params) after good ones: the good ones were queued, and ran in the
    caller's next step; now nothing is queued and the next generate is unaffected."""
    with pytest.raises(ValueError, match="token ids"):
        eng.generate([[3, 4], [5, 6], [7, -1]], GOOD)
    _unchanged(eng)
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        eng.generate([[3, 4], [5, 6], [7, 8]], [GOOD, GOOD])
    _unchanged(eng)
    assert drain(eng) == []
    assert [len(o) for o in eng.generate([[3, 4]], GOOD)] == [3]


@pytest.mark.parametrize("name", ["min_macs_per_thread", "graph_max_batch"])
def test_engine_config_refuses_bools(name):
    with pytest.raises(ValueError, match=f"^{name} must be an integer"):
        EngineConfig(**{name: True})


@pytest.mark.parametrize("name", ["reconsider", "max_drafters"])
def test_spec_config_refuses_bools(name):
    with pytest.raises(ValueError, match=f"^spec.{name} must be an integer"):
        SpecConfig(**{name: True})
