"""Continuous batching: which traces run this step and how many tokens each feeds.

Running traces go first in priority order (decode rows, or the rest of a chunked prefill); waiting
traces are admitted by free blocks while the token budget lasts. When a running trace cannot get
the block it needs, the lowest-priority running trace is preempted (freed, requeued to recompute)
or evicted (freed, reported, never requeued) — the caller's choice — passing over one whose release
frees no block (every block also held by a trace that stays: a fork's child at a block boundary
holds only its parent's blocks), which was dropped for nothing.

Admission keeps headroom: a waiting trace joins running ones only when the blocks stay free for
every one of them (itself included) to grow ``lookahead`` more tokens. Without it a trace was
admitted into the last free blocks and preempted a token or two later, its whole prefix
recomputed each time (a tiny cache spent most of its forwards re-prefilling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gambit.engine.block_manager import BlockManager, OutOfBlocks
from gambit.engine.sequence import Trace, TraceStatus


@dataclass
class ScheduledBatch:
    traces: list[Trace] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)  # tokens each trace feeds this step
    evicted: list[Trace] = field(default_factory=list)
    preempted: list[Trace] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.traces)


def _rank(t: Trace) -> tuple[float, int]:
    """Sort key: higher priority first, then earlier arrival."""
    return (-t.priority, t.arrival)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption: str, lookahead: int = 0) -> None:
        self.blocks = blocks
        self.lookahead = lookahead  # tokens of growth each running trace keeps room for at admission
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.preemption = preemption
        # by trace id: removing one (an abort, a finish, a search's prune) is O(1); a scan of ~100
        # queued traces per removal was a third of a search round's fork + abort. Scheduling sorts
        # the values by ``_rank`` (a total order: arrival is unique), so the dicts' order never matters.
        self.waiting: dict[int, Trace] = {}
        self.running: dict[int, Trace] = {}

    def add(self, trace: Trace) -> None:
        trace.status = TraceStatus.WAITING
        self.waiting[trace.id] = trace

    def add_running(self, trace: Trace) -> None:
        trace.status = TraceStatus.RUNNING
        self.running[trace.id] = trace

    def remove(self, trace: Trace) -> None:
        for q in (self.waiting, self.running):
            if q.get(trace.id) is trace:
                del q[trace.id]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _release(self, victim: Trace, batch: ScheduledBatch) -> None:
        self.remove(victim)  # it is running
        self.blocks.free(victim)
        if self.preemption == "evict":
            victim.status = TraceStatus.EVICTED
            victim.finish_reason = "evicted"
            batch.evicted.append(victim)
        else:
            self.add(victim)
            batch.preempted.append(victim)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        queue = sorted(self.running.values(), key=_rank)
        queue.reverse()  # taken from the end: best first, and the lowest-ranked is queue[0]
        bs = self.blocks.block_size
        traces, num_new = batch.traces, batch.num_new
        while queue and budget > 0:
            t = queue.pop()
            n = min(len(t.token_ids) - t.num_cached, budget)
            if t.num_cached + n <= len(t.block_table) * bs:  # its blocks hold it (most decode steps)
                traces.append(t)
                num_new.append(n)
                budget -= n
                continue
            while True:
                try:
                    self.blocks.ensure(t, t.num_cached + n)
                    break
                except OutOfBlocks:
                    victim = self._victim(queue, t, traces)
                    self._release(victim, batch)
                    if victim is t:
                        break
            if t.status is TraceStatus.RUNNING:
                batch.traces.append(t)
                batch.num_new.append(n)
                budget -= n
        if batch.evicted or batch.preempted:
            return batch  # under pressure: admit nobody this step
        if self.waiting:
            self._admit(batch, budget)
        return batch

    def _victim(self, queue: list[Trace], t: Trace, kept: list[Trace]) -> Trace:
        """The lowest-ranked trace not yet scheduled (``queue[0]`` first) whose release can free a
        block for ``t``; ``t`` itself when none is left. A trace whose every block ``t`` or a trace
        already scheduled (``kept``) also holds frees nothing: it was preempted or evicted for no
        block (in "evict" mode lost), and the next victim taken anyway."""
        rc, held = self.blocks.refcount, None
        for i, v in enumerate(queue):
            table = v.block_table
            if table and rc[table[-1]] == 1:  # its own last block (the usual case): that one frees
                return queue.pop(i)
            if held is None:  # shared blocks at most: which of them stay held (built once)
                held = {b for x in (t, *kept) for b in x.block_table}
            if any(b not in held for b in table):
                return queue.pop(i)
        return t

    def _ahead(self, t: Trace) -> int:
        """Blocks ``t`` must still gain to cache its tokens and ``lookahead`` more (not past its
        max_tokens: the last token sampled is never fed)."""
        n = len(t.token_ids)
        return self.blocks.extra_blocks(t, max(n, min(n + self.lookahead,
                                                      t.prompt_len + t.params.max_tokens - 1)))

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        """Waiting traces in rank order while the budget, the seat cap and the blocks last; with
        traces running, only while the blocks free cover every one's ``_ahead`` (the first admitted
        into an idle engine needs only its tokens: the cache may hold no more)."""
        if budget <= 0 or len(self.running) >= self.max_num_seqs or not self.blocks.num_free:
            return  # nobody can join: no sort of the queue, no sum over the running traces
        reserve = None  # the running traces' ``_ahead``, summed once the first candidate fits
        for t in sorted(self.waiting.values(), key=_rank):
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            n = min(len(t.token_ids), budget)
            need = self.blocks.extra_blocks(t, n)
            if need > self.blocks.num_free:
                break
            if reserve is None:
                reserve = sum(self._ahead(r) for r in self.running.values()) if self.lookahead else 0
            ahead = self._ahead(t) if self.lookahead else 0
            if self.running and reserve + ahead > self.blocks.num_free:
                break
            del self.waiting[t.id]
            self.blocks.ensure(t, n)
            reserve += ahead - need
            self.add_running(t)
            batch.traces.append(t)
            batch.num_new.append(n)
            budget -= n
