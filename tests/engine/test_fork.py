"""Fork: a child continues exactly as a fresh trace prefilled with the parent's tokens would.

Sampling noise is a function of (seed, position) only, so a child forked with seed ``s`` when the
parent holds tokens ``T`` must produce the same continuation as ``add(T, seed=s)`` in a fresh engine
(a different batch, a re-prefilled KV cache). Children share the parent's full blocks and copy
only its partial last block.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_util import drain, make_engine, slot_major

from gambit.engine import Engine, FinishedEvent, SamplingParams, TokenEvent, TraceStatus

BS = 8
MAX_TOKENS = 40
PARAMS = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=11, max_tokens=MAX_TOKENS, ignore_eos=True)
# hot and unfiltered: different seeds must give different continuations even from a trained model
HOT = SamplingParams(temperature=2.0, seed=11, max_tokens=MAX_TOKENS, ignore_eos=True)
PROMPT = "Compute (44+30)*5-6+97.\nSolution:\n"


def _finished(events) -> dict[int, FinishedEvent]:
    return {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}


def _fresh(target, prompts_params: list[tuple[list[int], SamplingParams]]) -> list[list[int]]:
    """Outputs of fresh traces, all in one batch of a new engine."""
    eng = make_engine(target, block_size=BS, num_blocks=256)
    return eng.generate([p for p, _ in prompts_params], [sp for _, sp in prompts_params])


def _step_until(eng: Engine, tid: int, aligned: bool, min_generated: int = 5) -> list:
    """Step until the parent has generated enough and its cached length is (not) a block multiple."""
    events = []
    for _ in range(200):
        t = eng.get(tid)
        if t.num_generated >= min_generated and (t.num_cached % BS == 0) == aligned:
            return events
        events += eng.step()
    raise AssertionError("parent never reached the wanted cache length")


@pytest.mark.parametrize("params", [PARAMS, HOT], ids=["t0.8-topk-topp", "t2"])
@pytest.mark.parametrize("aligned", [True, False], ids=["block-multiple", "partial-block"])
def test_children_continue_like_fresh_traces(target, aligned, params):
    _, tok = target
    eng = make_engine(target, block_size=BS, num_blocks=256)
    pid = eng.add(PROMPT, params)
    events = _step_until(eng, pid, aligned)
    parent = eng.get(pid)
    at_fork = list(parent.token_ids)
    generated = parent.num_generated
    n_cached = parent.num_cached
    assert n_cached == len(at_fork) - 1  # the last sampled token is fed by the next step
    full, partial = divmod(n_cached, BS)
    assert bool(partial) != aligned
    parent_table = list(parent.block_table)
    used_before = eng.blocks.num_used

    seeds = [101, 202, 303]
    kids = eng.fork(pid, 3, seeds=seeds)
    assert eng.stats.forks == 3
    # KV grows by at most one block per child: exactly one when the last block is partial
    assert eng.blocks.num_used - used_before == (3 if partial else 0)
    assert eng.kv_usage() == eng.blocks.num_used / eng.num_blocks
    for b in parent_table[:full]:
        assert eng.blocks.refcount[b] == 4  # parent + 3 children
    if partial:
        assert eng.blocks.refcount[parent_table[full]] == 1  # the parent's partial block is its own
    own = set()
    cache = eng.runner.cache
    for cid in kids:
        c = eng.get(cid)
        assert c.status is TraceStatus.RUNNING and c.parent == pid
        assert c.token_ids == at_fork and c.prompt_len == parent.prompt_len
        assert c.num_cached == n_cached and c.seed in seeds
        assert c.block_table[:full] == parent_table[:full]
        assert len(c.block_table) == full + (1 if partial else 0)
        if partial:
            dst, src = c.block_table[full], parent_table[full]
            assert dst not in parent_table and eng.blocks.refcount[dst] == 1
            own.add(dst)
            # the copied slots hold the parent's keys and values
            for kv in (cache.k, cache.v):
                slots = slot_major(kv, eng.num_blocks, BS)
                copied = slots[:, dst * BS: dst * BS + partial]
                assert torch.equal(copied, slots[:, src * BS: src * BS + partial])
    assert len(own) == (3 if partial else 0)
    eng.blocks.check(list(eng.traces.values()))

    events += drain(eng)
    fin = _finished(events)
    assert set(fin) == {pid, *kids}
    rest = MAX_TOKENS - generated
    refs = _fresh(target, [(at_fork, dataclasses.replace(params, seed=s, max_tokens=rest)) for s in seeds]
                  + [(tok.encode(PROMPT), params)])
    conts = []
    for cid, ref in zip(kids, refs, strict=False):
        out = list(fin[cid].output_ids)
        assert len(out) == MAX_TOKENS and fin[cid].reason == "length"
        assert out[:generated] == at_fork[parent.prompt_len:]
        assert out[generated:] == ref, f"child {cid} diverges from a fresh trace with its seed"
        conts.append(tuple(out[generated:]))
        # token events of the child start right after the fork point
        pos = [e.position for e in events if isinstance(e, TokenEvent) and e.trace_id == cid]
        assert pos == list(range(len(at_fork), len(at_fork) + rest))
    if params is HOT:
        assert len(set(conts)) == 3  # different seeds, different continuations
    # the parent is unaffected by its children (its partial block was copied, not shared)
    assert list(fin[pid].output_ids) == refs[-1]
    assert eng.blocks.num_free == eng.num_blocks
    assert eng.blocks.refcount == [0] * eng.num_blocks


def test_child_with_its_own_temperature(target):
    eng = make_engine(target, block_size=BS, num_blocks=256)
    pid = eng.add(PROMPT, PARAMS)
    events = _step_until(eng, pid, aligned=False, min_generated=3)
    at_fork = list(eng.get(pid).token_ids)
    generated = eng.get(pid).num_generated
    temps = [0.0, 1.5]
    kids = eng.fork(pid, 2, seeds=[7, 8], temperatures=temps)
    assert [eng.get(c).params.temperature for c in kids] == temps
    assert eng.get(pid).params.temperature == PARAMS.temperature
    # everything else is inherited
    assert all(eng.get(c).params.top_k == PARAMS.top_k and eng.get(c).params.top_p == PARAMS.top_p
               for c in kids)
    fin = _finished(events + drain(eng))
    rest = MAX_TOKENS - generated
    refs = _fresh(target, [(at_fork, dataclasses.replace(PARAMS, seed=7, temperature=0.0, max_tokens=rest)),
                           (at_fork, dataclasses.replace(PARAMS, seed=8, temperature=1.5, max_tokens=rest))])
    for cid, ref in zip(kids, refs, strict=True):
        assert list(fin[cid].output_ids)[generated:] == ref
    # the greedy child really is greedy: a different seed gives the same tokens
    greedy_other_seed = _fresh(target, [(at_fork, dataclasses.replace(PARAMS, seed=99, temperature=0.0,
                                                                        max_tokens=rest))])[0]
    assert greedy_other_seed == refs[0]


def test_fork_of_waiting_trace(target):
    _, tok = target
    eng = make_engine(target, block_size=BS, num_blocks=256)
    pid = eng.add(PROMPT, PARAMS)
    kids = eng.fork(pid, 2, seeds=[5, 6], priority=2.0)
    assert eng.blocks.num_used == 0  # nothing prefilled yet: nothing shared, nothing copied
    for cid in kids:
        c = eng.get(cid)
        assert c.status is TraceStatus.WAITING and c.block_table == [] and c.num_cached == 0
        assert c.priority == 2.0
    fin = _finished(drain(eng))
    prompt = tok.encode(PROMPT)
    refs = _fresh(target, [(prompt, dataclasses.replace(PARAMS, seed=s)) for s in (5, 6)]
                  + [(prompt, PARAMS)])
    assert [list(fin[c].output_ids) for c in kids] == refs[:2]
    assert list(fin[pid].output_ids) == refs[2]
    assert eng.blocks.num_free == eng.num_blocks


def test_fork_without_free_block_reprefills_child(target):
    """A child whose partial block cannot be allocated waits and is re-prefilled, same result."""
    _, tok = target
    prompt = tok.encode(PROMPT)
    # exactly the blocks the parent ever holds (its last token is never fed): the cache fills up
    n_blocks = -(-(len(prompt) + MAX_TOKENS - 1) // BS)
    eng = make_engine(target, block_size=BS, num_blocks=n_blocks)
    pid = eng.add(prompt, PARAMS)
    events = []
    for _ in range(MAX_TOKENS):
        if eng.blocks.num_free == 0 and eng.get(pid).num_cached % BS:
            break
        events += eng.step()
    else:
        raise AssertionError("the cache never filled up")
    parent = eng.get(pid)
    at_fork, generated = list(parent.token_ids), parent.num_generated
    (cid,) = eng.fork(pid, 1, seeds=[42])
    assert eng.get(cid).status is TraceStatus.WAITING and eng.get(cid).block_table == []
    assert eng.blocks.num_free == 0
    eng.blocks.check(list(eng.traces.values()))
    fin = _finished(events + drain(eng))
    ref = _fresh(target, [(at_fork, dataclasses.replace(PARAMS, seed=42, max_tokens=MAX_TOKENS - generated))])
    assert list(fin[cid].output_ids)[generated:] == ref[0]
    assert eng.blocks.num_free == n_blocks


def test_grandchild_shares_blocks_through_two_forks(target):
    eng = make_engine(target, block_size=BS, num_blocks=256)
    pid = eng.add(PROMPT, PARAMS)
    _step_until(eng, pid, aligned=True)
    (cid,) = eng.fork(pid, 1, seeds=[1])
    for _ in range(3):
        eng.step()
    child = eng.get(cid)
    (gid,) = eng.fork(cid, 1, seeds=[2])
    shared = child.block_table[: child.num_cached // BS]
    first = eng.get(pid).block_table
    for b in shared:
        expected = 3 if b in first else 2
        assert eng.blocks.refcount[b] == expected
    at_fork, generated = list(child.token_ids), child.num_generated
    fin = _finished(drain(eng))
    ref = _fresh(target, [(at_fork, dataclasses.replace(PARAMS, seed=2, max_tokens=MAX_TOKENS - generated))])
    assert list(fin[gid].output_ids)[generated:] == ref[0]
    assert eng.blocks.num_free == eng.num_blocks


@pytest.mark.parametrize("decoding", ["plain", "pr"])
def test_children_above_max_num_seqs_wait_and_continue_the_same(target, decoding):
    """``max_num_seqs`` bounds forks too: children beyond it wait (prefilled when a slot frees, as
    ``add_samples``' followers) and continue exactly as fresh plain traces, speculative ones too; no
    step runs more traces. A fork of 10 at a cap of 4 ran 11 traces a step."""
    from gambit.speculative import random_drafter

    eng = make_engine(target, block_size=BS, num_blocks=256, max_num_seqs=4)
    if decoding != "plain":
        eng.register_drafter(decoding, random_drafter(eng.model, seed=2, method="pr"))
    params = dataclasses.replace(PARAMS, decoding=decoding)
    pid = eng.add(PROMPT, params)
    events = _step_until(eng, pid, aligned=False)
    parent = eng.get(pid)
    at_fork, generated = list(parent.token_ids), parent.num_generated
    seeds = list(range(100, 106))
    kids = eng.fork(pid, 6, seeds=seeds)
    assert eng.stats.forks == 6 and len(eng.scheduler.running) == 4
    assert [eng.get(c).status for c in kids] == [TraceStatus.RUNNING] * 3 + [TraceStatus.WAITING] * 3
    assert all(eng.get(c).block_table == [] and eng.get(c).num_cached == 0 for c in kids[3:])
    eng.blocks.check(list(eng.traces.values()))
    while eng.has_unfinished():
        events += eng.step()
        assert len(eng.scheduler.running) <= 4
        eng.blocks.check(list(eng.traces.values()))
    assert eng.stats.max_batch_size == 4
    if decoding != "plain":
        assert eng.stats.spec_drafts > 0  # trees were drafted and verified
    fin = _finished(events)
    refs = _fresh(target, [(at_fork, dataclasses.replace(PARAMS, seed=s, max_tokens=MAX_TOKENS - generated))
                           for s in seeds])
    for cid, ref in zip(kids, refs, strict=True):
        assert list(fin[cid].output_ids) == at_fork[parent.prompt_len:] + ref
    assert eng.blocks.num_free == eng.num_blocks


def test_a_fork_within_max_num_seqs_still_shares_the_kv(target):
    """Below the cap nothing changed: every child runs at once on the parent's blocks."""
    eng = make_engine(target, block_size=BS, num_blocks=256, max_num_seqs=4)
    pid = eng.add(PROMPT, PARAMS)
    _step_until(eng, pid, aligned=True)
    kids = eng.fork(pid, 3)
    assert all(eng.get(c).status is TraceStatus.RUNNING and eng.get(c).num_cached for c in kids)
    assert eng.blocks.num_used == len(eng.get(pid).block_table)  # block-aligned: all shared, none copied
