"""The scheduler and block manager at the edge of tiny pools: forks into an exhausted pool, victims
under pressure, admission with every seat taken. After each operation the refcounts equal the
references held, free + used = total, and nothing leaks once every trace is freed.
"""

from __future__ import annotations

import random

import pytest

from gambit.engine.block_manager import BlockManager, OutOfBlocks
from gambit.engine.scheduler import Scheduler
from gambit.engine.sequence import SamplingParams, Trace, TraceStatus

P = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)


def _trace(tid: int, length: int, priority: float = 0.0, params: SamplingParams = P) -> Trace:
    return Trace(tid, list(range(3, 3 + length)), length, params, seed=tid, priority=priority, arrival=tid)


def _check(bm: BlockManager, traces: list[Trace]) -> None:
    bm.check([t for t in traces if t.block_table])
    assert bm.num_free + bm.num_used == bm.num_blocks
    assert bm.num_used == len({b for t in traces for b in t.block_table})


def _running(sched: Scheduler, t: Trace, cached: int) -> Trace:
    """``t`` admitted with ``cached`` of its tokens in the cache (what a step leaves)."""
    sched.blocks.ensure(t, cached)
    t.num_cached = cached
    sched.add_running(t)
    return t


def _fork(sched: Scheduler, parent: Trace, cid: int, priority: float | None = None) -> Trace:
    """What ``Engine.fork`` does with a parent's KV: a running child on its blocks."""
    child = Trace(cid, list(parent.token_ids), parent.prompt_len, parent.params, seed=cid,
                  priority=parent.priority if priority is None else priority, arrival=cid, parent=parent.id)
    sched.blocks.fork(parent, child)
    sched.add_running(child)
    return child


def test_fork_into_an_exhausted_pool_changes_nothing_or_shares_only():
    """A partial last block with no block free: OutOfBlocks and no refcount, free list or child field
    moved. At a block boundary the child needs no block now: it shares every one, takes none."""
    bm = BlockManager(3, 4)
    parent = _trace(0, 11)
    bm.ensure(parent, 10)  # 3 blocks, the last holding 2 of 4 slots
    parent.num_cached = 10
    assert bm.num_free == 0
    before = (list(bm.refcount), list(bm.free_blocks))
    child = _trace(1, 11)
    with pytest.raises(OutOfBlocks):
        bm.fork(parent, child)
    assert (list(bm.refcount), list(bm.free_blocks)) == before
    assert child.block_table == [] and child.num_cached == 0
    _check(bm, [parent, child])
    bm.truncate(parent, 8)  # now block-aligned: 2 full blocks, one free
    parent.num_cached = 8
    bm.ensure(_trace(2, 4), 4)  # someone takes the free block
    assert bm.num_free == 0 and bm.fork(parent, child) is None
    assert child.block_table == parent.block_table and child.num_cached == 8
    assert [bm.refcount[b] for b in parent.block_table] == [2, 2]
    bm.free(parent)
    bm.free(child)
    assert bm.num_free == 2 and bm.refcount.count(0) == 2


@pytest.mark.parametrize("mode", ["evict", "recompute"])
def test_a_victim_whose_release_frees_no_block_is_passed_over(mode):
    """P (first) needs a block; the lowest-ranked trace is its child C, forked at a block boundary, so
    every block C holds P holds too. Releasing C frees nothing: it was evicted (in "evict" mode lost
    for good) before R, whose blocks do free. Now only R goes, and C takes R's second block."""
    bm = BlockManager(4, 4)
    sched = Scheduler(bm, 256, 8192, mode)
    p = _running(sched, _trace(0, 9), 8)  # 2 full blocks, token 9 to feed
    r = _running(sched, _trace(1, 8), 7)  # 2 blocks of its own
    c = _fork(sched, p, 2)
    assert bm.num_free == 0 and c.block_table == p.block_table
    batch = sched.schedule()
    gone = batch.evicted if mode == "evict" else batch.preempted
    assert [t.id for t in gone] == [1]  # the old code: [2, 1]
    assert [t.id for t in batch.traces] == [0, 2]
    assert r.block_table == [] and c.status is TraceStatus.RUNNING
    _check(bm, [p, r, c])


def test_a_low_ranked_parent_sharing_every_block_with_its_children_is_passed_over():
    """Gambit's children take their own priority: a parent ranked below its child at a block boundary
    holds only blocks the child holds. Evicting it for the child's block freed nothing."""
    bm = BlockManager(4, 4)
    sched = Scheduler(bm, 256, 8192, "evict")
    p = _running(sched, _trace(0, 9, priority=0.0), 8)
    r = _running(sched, _trace(1, 8, priority=0.5), 7)
    c = _fork(sched, p, 2, priority=1.0)
    batch = sched.schedule()
    assert [t.id for t in batch.evicted] == [1]  # the old code: [0, 1]
    assert [t.id for t in batch.traces] == [2, 0]
    _check(bm, [p, r, c])


def test_when_no_victim_frees_a_block_the_trace_itself_goes():
    """The rule passes over useless victims but still ends with the trace itself: no stall, no hang."""
    bm = BlockManager(2, 4)
    sched = Scheduler(bm, 256, 8192, "evict")
    p = _running(sched, _trace(0, 9), 8)
    c = _fork(sched, p, 1)
    batch = sched.schedule()
    assert sorted(t.id for t in batch.evicted) == [0, 1]  # neither can grow: both go (the old code too)
    assert bm.num_free == 2 and not sched.running
    _check(bm, [p, c])


def test_admission_with_every_seat_taken_sums_no_headroom(monkeypatch):
    """With ``max_num_seqs`` traces running (forks beyond it wait), a step's admission did a sum of
    ``_ahead`` over every running trace and a sort of the queue for nothing."""
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, 2, 8192, "recompute", lookahead=16)
    for i in range(4):
        sched.add(_trace(i, 5))
    assert [t.id for t in sched.schedule().traces] == [0, 1]
    calls = []
    real = sched._ahead
    monkeypatch.setattr(sched, "_ahead", lambda t: calls.append(t.id) or real(t))
    for t in sched.running.values():
        t.num_cached = len(t.token_ids)
        t.token_ids.append(7)
    assert [t.id for t in sched.schedule().traces] == [0, 1] and calls == []
    assert list(sched.waiting) == [2, 3]


@pytest.mark.parametrize("mode", ["evict", "recompute"])
def test_random_forks_and_growth_in_tiny_pools_keep_the_books(mode):
    """Scheduler steps (tokens appended as a step would), forks at any offset, aborts and finishes in
    pools of 3-10 blocks: the books balance after every operation and everything frees at the end."""
    for seed in range(30):
        rng = random.Random(seed)
        bs, nb = rng.choice([2, 4]), rng.randint(3, 10)
        bm = BlockManager(nb, bs)
        sched = Scheduler(bm, rng.choice([2, 256]), rng.choice([3, 64]), mode, lookahead=rng.choice([0, 4]))
        live: dict[int, Trace] = {}
        nid = 0
        for _ in range(80):
            op = rng.random()
            if op < 0.2 and len(live) < 8:
                t = _trace(nid, rng.randint(1, nb * bs // 2),
                           params=SamplingParams(max_tokens=rng.randint(1, 12)))
                nid += 1
                live[t.id] = t
                sched.add(t)
            elif op < 0.35 and live:
                par = live[rng.choice(sorted(live))]
                child = Trace(nid, list(par.token_ids), par.prompt_len, par.params, seed=nid, arrival=nid,
                              priority=rng.choice([par.priority, 1.0]))
                nid += 1
                live[child.id] = child
                try:
                    if par.status is not TraceStatus.RUNNING or not par.num_cached:
                        raise OutOfBlocks("waits")
                    bm.fork(par, child)
                    sched.add_running(child)
                except OutOfBlocks:
                    assert child.block_table == []
                    sched.add(child)
            elif op < 0.4 and live:
                t = live.pop(rng.choice(sorted(live)))
                sched.remove(t)
                bm.free(t)
            else:
                batch = sched.schedule()
                for t in batch.evicted:
                    live.pop(t.id)
                for t, n in zip(batch.traces, batch.num_new, strict=True):
                    assert t.num_cached + n <= len(t.block_table) * bs
                    t.num_cached += n
                    if t.num_cached == len(t.token_ids):
                        t.token_ids.append(5)
                        if t.num_generated >= t.params.max_tokens or len(t.token_ids) >= nb * bs:
                            sched.remove(t)
                            bm.free(t)
                            live.pop(t.id)
            _check(bm, list(live.values()))
            for t in live.values():
                assert (t.status is TraceStatus.RUNNING) == bool(t.block_table), t
        for t in live.values():
            sched.remove(t)
            bm.free(t)
        assert bm.num_free == nb and bm.refcount == [0] * nb and not sched.has_work()


@pytest.mark.parametrize("bad", [True, False, "0.7", float("nan"), -0.1])
def test_temperature_refuses_bools_and_non_numbers(bad):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=bad)
    with pytest.raises(ValueError, match="temperature"):
        P.child(1, bad)


def test_temperature_takes_any_real_number_as_a_float():
    np = pytest.importorskip("numpy")
    for t in (np.float32(0.5), np.float64(0.5), 0.5, np.int64(1), 1):
        p = SamplingParams(temperature=t)
        assert type(p.temperature) is float and p.temperature == float(t)
        assert type(P.child(1, t).temperature) is float


def test_a_speculative_trace_in_a_full_cache_decodes_plainly_with_the_same_tokens():
    """A draft tree writes 1 + budget KV slots before verification trims them; the scheduler reserves
    only the fed token's. Where the tree's blocks cannot be had, drafting takes none (all or nothing)
    and the trace decodes plainly: no step fails, no preemption, the same greedy tokens."""
    from engine_util import make_engine, tiny_model

    from gambit.speculative import random_drafter

    tiny = tiny_model(layers=4)  # an EAGLE-3 drafter taps three distinct layers
    prompts = [[5, 9, 14, 3, 22, 7], [8, 30, 12, 4, 19, 6]]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outs, refused = {}, []
    for decoding in ("plain", "pr"):
        # 14 blocks of 4 hold both traces' 25 fed tokens each and 3 slots more: the first's tree of
        # 1 + 6 slots fits early and not later
        eng = make_engine(tiny, block_size=4, num_blocks=14, admit_lookahead=0,
                          spec={"max_batch": 0, "budget": 6})
        eng.register_drafter("pr", random_drafter(eng.model, seed=2, method="pr"))
        ensure = eng.blocks.ensure

        def counted(t, n, ensure=ensure):
            try:
                ensure(t, n)
            except OutOfBlocks:
                refused.append(n)
                raise
        eng.blocks.ensure = counted
        plist = [SamplingParams(**{**params.__dict__, "decoding": decoding}), params]
        outs[decoding] = eng.generate(prompts, plist)
        assert eng.stats.preemptions == 0 and eng.blocks.num_free == 14
        if decoding == "pr":
            assert eng.stats.spec_drafts > 0 and refused  # trees drafted, and some refused
    assert outs["pr"] == outs["plain"] and [len(o) for o in outs["pr"]] == [20, 20]
