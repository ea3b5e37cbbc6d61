"""Random add / fork / abort / set_priority / step sequences never leak or double-free a KV block.

A Hypothesis state machine drives a real engine (a 2-layer, hidden-32 model, so steps take about a
millisecond) with a small cache and small token budgets, in both preemption modes. After every
operation the block refcounts must equal the references held by live traces, utilisation must be
exactly used/total, waiting traces hold nothing; evicted traces hold nothing and never speak again;
each trace's token events come at consecutive positions; and once everything has finished, every
block is free.
"""

from __future__ import annotations

import pytest
from engine_util import make_engine
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gambit.engine import EvictedEvent, FinishedEvent, SamplingParams, TokenEvent, TraceStatus

MAX_LIVE = 24
OPS = {"count": 0, "preemptions": 0, "evictions": 0, "shared_forks": 0, "waiting_forks": 0}


class EngineMachine(RuleBasedStateMachine):
    def __init__(self, model_tok, mode: str) -> None:
        super().__init__()
        self.model_tok = model_tok
        self.mode = mode
        self.eng = None
        self.created: list[int] = []  # every id ever returned, in order
        self.objs = {}  # id → Trace object (kept after the engine drops it)
        self.closed: dict[int, str] = {}  # id → "finished:<reason>" | "evicted" (its last event seen)
        self.aborted: set[int] = set()  # aborted, FinishedEvent('abort') not necessarily seen yet
        self.next_pos: dict[int, int] = {}  # the position the trace's next token event must carry
        self.evictions = 0

    # -- setup ------------------------------------------------------------------------------
    @initialize(block_size=st.sampled_from([2, 4, 8]), num_blocks=st.integers(12, 40),
                budget=st.sampled_from([6, 32, 4096]), max_seqs=st.sampled_from([3, 256]),
                lookahead=st.sampled_from([0, 4, 16]))
    def setup(self, block_size, num_blocks, budget, max_seqs, lookahead):
        # admit_lookahead 0 (admit into the last blocks) keeps the preemption paths busy; > 0 its headroom
        self.eng = make_engine(self.model_tok, block_size=block_size, num_blocks=num_blocks,
                               max_num_batched_tokens=budget, max_num_seqs=max_seqs, preemption=self.mode,
                               admit_lookahead=lookahead)
        self.capacity = block_size * num_blocks

    def _live_ids(self) -> list[int]:
        return [i for i in self.created if i not in self.closed and i not in self.aborted]

    def _pick(self, data, live_only: bool = False) -> int | None:
        pool = self._live_ids() if live_only else self.created
        return data.draw(st.sampled_from(pool)) if pool else None

    def _expect_dead(self, tid: int) -> bool:
        return tid in self.closed or tid in self.aborted

    # -- operations ---------------------------------------------------------------------------
    @precondition(lambda self: len(self._live_ids()) < MAX_LIVE)
    @rule(data=st.data(), temperature=st.sampled_from([0.0, 0.7, 1.0]), priority=st.integers(-2, 2),
          ignore_eos=st.booleans())
    def add(self, data, temperature, priority, ignore_eos):
        OPS["count"] += 1
        vocab = self.eng.model.config.vocab_size
        n = data.draw(st.integers(1, min(16, self.capacity // 2)), label="prompt_len")
        prompt = data.draw(st.lists(st.integers(3, vocab - 1), min_size=n, max_size=n), label="prompt")
        # a trace never outgrows the whole cache (see test_trace_longer_than_cache_terminates)
        max_tokens = data.draw(st.integers(1, min(24, self.capacity - n)), label="max_tokens")
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos)
        tid = self.eng.add(prompt, params, priority=priority)
        assert tid not in self.objs
        self._register(tid)
        t = self.objs[tid]
        assert t.status is TraceStatus.WAITING and t.block_table == []

    def _register(self, tid: int) -> None:
        t = self.eng.get(tid)
        self.created.append(tid)
        self.objs[tid] = t
        self.next_pos[tid] = len(t.token_ids)

    @precondition(lambda self: self.created and len(self._live_ids()) < MAX_LIVE)
    @rule(data=st.data(), n=st.integers(1, 3), with_seeds=st.booleans(),
          temperature=st.sampled_from([None, 0.0, 1.3]))
    def fork(self, data, n, with_seeds, temperature):
        OPS["count"] += 1
        tid = self._pick(data)
        seeds = list(range(7, 7 + n)) if with_seeds else None
        temps = None if temperature is None else [temperature] * n
        if self._expect_dead(tid):
            with pytest.raises(ValueError):
                self.eng.fork(tid, n, seeds=seeds, temperatures=temps)
            return
        parent = self.eng.get(tid)
        used = self.eng.blocks.num_used
        kids = self.eng.fork(tid, n, seeds=seeds, temperatures=temps)
        assert len(kids) == n == len(set(kids))
        assert self.eng.blocks.num_used - used <= n  # at most one new (partial) block per child
        for c in kids:
            self._register(c)
            child = self.objs[c]
            assert child.token_ids == parent.token_ids and child.parent == tid
            OPS["shared_forks" if child.status is TraceStatus.RUNNING else "waiting_forks"] += 1
            if child.status is TraceStatus.RUNNING:
                full = parent.num_cached // self.eng.blocks.block_size
                assert child.block_table[:full] == parent.block_table[:full]
                assert child.num_cached == parent.num_cached

    @precondition(lambda self: self.created)
    @rule(data=st.data())
    def abort(self, data):
        OPS["count"] += 1
        tid = self._pick(data)
        if self._expect_dead(tid):
            with pytest.raises(ValueError):
                self.eng.abort(tid)
            return
        self.eng.abort(tid)
        self.aborted.add(tid)
        t = self.objs[tid]
        assert t.block_table == [] and t.status is TraceStatus.FINISHED and tid not in self.eng.traces

    @precondition(lambda self: self.created)
    @rule(data=st.data(), priority=st.integers(-3, 3))
    def set_priority(self, data, priority):
        OPS["count"] += 1
        tid = self._pick(data)
        if self._expect_dead(tid):
            with pytest.raises(ValueError):
                self.eng.set_priority(tid, priority)
            return
        self.eng.set_priority(tid, priority)
        assert self.eng.get(tid).priority == priority

    @rule(k=st.integers(1, 4))
    def step(self, k):
        for _ in range(k):
            OPS["count"] += 1
            self._consume(self.eng.step())
            self.check_blocks()

    def _consume(self, events) -> None:
        for e in events:
            tid = e.trace_id
            assert tid in self.objs, f"event for unknown trace {tid}"
            assert tid not in self.closed, f"{type(e).__name__} for trace {tid} after its {self.closed[tid]}"
            if isinstance(e, TokenEvent):
                assert tid not in self.aborted, f"token for aborted trace {tid}"
                assert e.position == self.next_pos[tid], (tid, e.position, self.next_pos[tid])
                self.next_pos[tid] += 1
            elif isinstance(e, FinishedEvent):
                if tid in self.aborted:
                    assert e.reason == "abort"
                else:
                    assert e.reason in ("eos", "length", "stop")
                t = self.objs[tid]
                assert tuple(t.output_ids) == e.output_ids
                assert t.block_table == [] and t.status is TraceStatus.FINISHED
                self.closed[tid] = f"finished:{e.reason}"
            elif isinstance(e, EvictedEvent):
                assert self.mode == "evict", "eviction in recompute mode"
                t = self.objs[tid]
                assert t.status is TraceStatus.EVICTED and t.block_table == [] and t.num_cached == 0
                assert tid not in self.eng.traces
                with pytest.raises(ValueError):
                    self.eng.get(tid)
                self.closed[tid] = "evicted"
                self.evictions += 1

    # -- invariants ---------------------------------------------------------------------------
    @invariant()
    def check_blocks(self):
        eng = self.eng
        if eng is None:
            return
        live = list(eng.traces.values())
        eng.blocks.check(live)
        assert eng.kv_usage() == eng.blocks.num_used / eng.num_blocks
        assert eng.blocks.num_used == len({b for t in live for b in t.block_table})
        assert eng.blocks.num_used + eng.blocks.num_free == eng.num_blocks
        assert set(eng.traces) == set(self._live_ids())
        waiting, running = eng.scheduler.waiting.values(), eng.scheduler.running.values()
        assert len(waiting) + len(running) == len(live)
        assert {id(t) for t in waiting} | {id(t) for t in running} == {id(t) for t in live}
        bs = eng.blocks.block_size
        for t in live:
            if t.status is TraceStatus.WAITING:
                assert t.block_table == [] and t.num_cached == 0, t
            else:
                assert t.status is TraceStatus.RUNNING
                assert t.num_cached < len(t.token_ids)
                assert -(-t.num_cached // bs) <= len(t.block_table) <= -(-len(t.token_ids) // bs)
        for tid, why in self.closed.items():
            assert self.objs[tid].block_table == [], (tid, why)

    def teardown(self):
        eng = self.eng
        if eng is None:
            return
        for _ in range(5000):
            if not eng.has_unfinished():
                break
            self._consume(eng.step())
            self.check_blocks()
        assert not eng.has_unfinished(), "engine never finished its traces"
        assert set(self.closed) == set(self.created)  # every trace got its last event
        assert eng.blocks.num_free == eng.num_blocks and eng.kv_usage() == 0.0
        assert eng.blocks.refcount == [0] * eng.num_blocks
        assert sorted(eng.blocks.free_blocks) == list(range(eng.num_blocks))
        assert eng.stats.evictions == self.evictions
        OPS["evictions"] += eng.stats.evictions
        OPS["preemptions"] += eng.stats.preemptions


@pytest.mark.parametrize("mode", ["recompute", "evict"])
def test_random_operations_never_leak_blocks(tiny, mode):
    before = dict(OPS)
    run_state_machine_as_test(
        lambda: EngineMachine(tiny, mode),
        # no shrinking: a failure reports its (unshrunk) steps at once instead of minutes later
        settings=settings(max_examples=30, stateful_step_count=50, deadline=None, derandomize=True,
                          phases=[Phase.explicit, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    done = {k: OPS[k] - before[k] for k in OPS}
    print(mode, done)
    assert done["count"] >= 1500  # thousands of operations over both modes
    # the pressure paths were exercised, not just the easy ones
    assert done["evictions" if mode == "evict" else "preemptions"] > 0
    assert done["shared_forks"] > 0 and done["waiting_forks"] > 0


def test_trace_longer_than_cache_terminates(tiny):
    """A trace that outgrows the whole KV cache must end (finished or evicted), not wait forever.

    In "recompute" mode the scheduler preempts the trace itself and requeues it; it then needs
    more blocks than exist, is never admitted again, and ``has_unfinished()`` stays True forever
    (``Engine.generate`` would never return).
    """
    for mode in ("evict", "recompute"):
        eng = make_engine(tiny, block_size=4, num_blocks=4, preemption=mode)
        tid = eng.add(list(range(3, 13)), SamplingParams(max_tokens=100, ignore_eos=True))
        last = []
        for _ in range(200):
            if not eng.has_unfinished():
                break
            last = [e for e in eng.step() if isinstance(e, FinishedEvent | EvictedEvent)] or last
        assert not eng.has_unfinished(), f"{mode}: trace {tid} longer than the cache never ends"
        assert [e.trace_id for e in last] == [tid]
        assert 10 + len(last[0].output_ids) <= 4 * 4 + 1
        assert eng.blocks.num_free == 4
