"""``Engine.add_samples``: n traces of one prompt, one prefill, the prompt's KV shared.

Each trace must emit exactly what ``add`` of the same prompt and params emits (sampling noise is a
function of seed and position only), the prompt is fed once, its full blocks are held once, and the
fall-backs (leader gone before its prefill completes, no block for a follower's partial copy, a
follower aborted while it waits) lose nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
from engine_util import drain, make_engine

from gambit.engine import FinishedEvent, SamplingParams, TokenEvent

BS = 8
PROMPTS = ["Compute (44+30)*5-6+97.\nSolution:\n", "Compute 7*8-3.\nSolution:\n", "Compute 12+9*3.\n"]
HOT = SamplingParams(temperature=1.5, top_k=30, max_tokens=24, ignore_eos=True)


def _params(n: int, base: SamplingParams = HOT, seed0: int = 100) -> list[SamplingParams]:
    return [dataclasses.replace(base, seed=seed0 + i) for i in range(n)]


def _outputs(events) -> dict[int, tuple[int, ...]]:
    return {e.trace_id: e.output_ids for e in events if isinstance(e, FinishedEvent)}


def _separate(target, groups, **cfg) -> list[list[tuple[int, ...]]]:
    eng = make_engine(target, block_size=BS, num_blocks=256, **cfg)
    ids = [[eng.add(p, sp) for sp in ps] for p, ps in groups]
    out = _outputs(drain(eng))
    return [[out[i] for i in g] for g in ids]


def _checked_drain(eng) -> list:
    """Drain, checking the block refcounts after every step."""
    events = []
    for _ in range(2000):
        if not eng.has_unfinished():
            assert eng.blocks.num_free == eng.num_blocks  # nothing leaked
            return events
        events.extend(eng.step())
        eng.blocks.check([t for t in eng.traces.values() if t.block_table])
    raise AssertionError("engine still busy")


def test_same_tokens_as_separate_adds_and_one_prefill(target):
    groups = [(p, _params(6, seed0=10 * i)) for i, p in enumerate(PROMPTS)]
    want = _separate(target, groups)
    eng = make_engine(target, block_size=BS, num_blocks=256)
    ids = [eng.add_samples(p, ps) for p, ps in groups]
    lens = [len(eng.tokenizer.encode(p)) for p in PROMPTS]
    eng.step()  # the three leaders' prefills; the followers take their KV and sample
    assert eng.stats.prompt_tokens == sum(lens)
    assert eng.stats.shared_prompt_tokens == 5 * sum(lens)
    # full prompt blocks once per group, the partial last block (and nothing else) per trace
    assert eng.blocks.num_used == sum(n // BS + 6 * (n % BS > 0) for n in lens)
    out = _outputs(_checked_drain(eng))
    assert [[out[i] for i in g] for g in ids] == want


def test_every_trace_draws_its_own_first_token(target):
    eng = make_engine(target, block_size=BS, num_blocks=256)
    ids = eng.add_samples(PROMPTS[0], _params(8, dataclasses.replace(HOT, temperature=3.0)))
    first = {e.trace_id: e.token_id for e in eng.step() if isinstance(e, TokenEvent)}
    assert sorted(first) == ids
    assert len(set(first.values())) > 1  # not the leader's token copied


def test_leader_aborted_before_its_prefill_completes(target):
    """Chunked prefill (8 tokens a step): the leader is aborted mid-prefill, so its followers
    prefill by themselves and still emit what separate adds emit."""
    ps = _params(4)
    want = _separate(target, [(PROMPTS[0], ps)], max_num_batched_tokens=8)[0]
    eng = make_engine(target, block_size=BS, num_blocks=256, max_num_batched_tokens=8)
    lead, *rest = eng.add_samples(PROMPTS[0], ps)
    eng.step()
    assert eng.get(lead).num_cached == 8 < eng.get(lead).prompt_len
    eng.abort(lead)
    out = _outputs(_checked_drain(eng))
    assert [out[i] for i in rest] == want[1:]
    assert eng.stats.shared_prompt_tokens == 0


def test_follower_aborted_while_waiting(target):
    ps = _params(4)
    want = _separate(target, [(PROMPTS[0], ps)])[0]
    eng = make_engine(target, block_size=BS, num_blocks=256)
    ids = eng.add_samples(PROMPTS[0], ps)
    eng.abort(ids[2])
    events = _checked_drain(eng)
    out = _outputs(events)
    reasons = {e.trace_id: e.reason for e in events if isinstance(e, FinishedEvent)}
    assert reasons[ids[2]] == "abort" and out[ids[2]] == ()
    assert [out[i] for i in ids[:2] + ids[3:]] == want[:2] + want[3:]


def test_no_block_for_a_partial_copy_falls_back_to_its_own_prefill(target):
    """A cache too small for every follower's partial block at once: the ones that cannot fork
    wait and prefill by themselves (recompute mode frees blocks as traces finish)."""
    ps = _params(4, dataclasses.replace(HOT, max_tokens=6))
    n = len(target[1].encode(PROMPTS[0]))
    assert n % BS
    want = _separate(target, [(PROMPTS[0], ps)])[0]
    eng = make_engine(target, block_size=BS, num_blocks=n // BS + 3, preemption="recompute")
    ids = eng.add_samples(PROMPTS[0], ps)
    out = _outputs(_checked_drain(eng))
    assert [out[i] for i in ids] == want
    assert 0 < eng.stats.shared_prompt_tokens < 3 * n


def test_fork_of_a_waiting_follower(target):
    ps = _params(3)
    eng = make_engine(target, block_size=BS, num_blocks=256)
    ids = eng.add_samples(PROMPTS[1], ps)
    (child,) = eng.fork(ids[1], 1, seeds=[7])
    out = _outputs(_checked_drain(eng))
    want = _separate(target, [(PROMPTS[1], ps + [dataclasses.replace(ps[1], seed=7)])])[0]
    assert [out[i] for i in ids + [child]] == want


def test_bad_input_changes_nothing(target):
    eng = make_engine(target, block_size=BS, num_blocks=256)
    with pytest.raises(ValueError, match="params is empty"):
        eng.add_samples(PROMPTS[0], [])
    with pytest.raises(ValueError, match="same decoding"):
        eng.add_samples(PROMPTS[0], [HOT, dataclasses.replace(HOT, decoding="pr")])
    with pytest.raises(ValueError, match="prompt is empty"):
        eng.add_samples("", [HOT, HOT])
    with pytest.raises(ValueError, match="SamplingParams"):
        eng.add_samples(PROMPTS[0], [HOT, "hot"])
    with pytest.raises(ValueError, match=r"^prompt: .*'é' \(U\+00E9\)"):  # encode would drop it
        eng.add_samples(PROMPTS[0] + "é", [HOT, HOT])
    with pytest.raises(ValueError, match=r"^prompt: .*'☕'"):
        eng.add("☕ " + PROMPTS[0], HOT)
    assert not eng.traces and not eng.has_unfinished() and not eng.shared

