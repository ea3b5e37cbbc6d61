"""Paged KV bookkeeping: a free list of fixed-size blocks with reference counts.

Blocks hold ``block_size`` token slots. A trace's block table maps its token positions to slots:
token ``i`` lives in slot ``table[i // bs] * bs + i % bs``. Full blocks are immutable, so a fork
shares them (refcount + 1) and copies only the partial last block.
"""

from __future__ import annotations

from collections import deque

from gambit.checks import at_least
from gambit.engine.sequence import Trace


class OutOfBlocks(RuntimeError):
    """Not enough free KV blocks for the request."""


def shared_prompt_blocks(prompt_len: int, num_tokens: int, n: int, block_size: int) -> int:
    """Blocks ``n`` traces of one prompt need at ``num_tokens`` tokens each when they share the
    prompt's full blocks (``Engine.add_samples``, forks): those once, the rest per trace."""
    full = min(prompt_len, num_tokens) // block_size
    return full + n * (-(-num_tokens // block_size) - full)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        at_least(1, num_blocks=num_blocks, block_size=block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.refcount = [0] * num_blocks
        # a stack: the block freed last is taken first (block 0 first at the start). Its lines are
        # likely still cached: a fork's partial-block copy right after a prune writes into the pruned
        # trace's last block, and a growing trace's new block was written a moment ago, where the
        # oldest free block (a queue) is cold and, the first time, an untouched page of the cache
        self.free_blocks: deque[int] = deque(range(num_blocks - 1, -1, -1))

    # -- accounting -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def usage(self) -> float:
        """Exact KV utilisation: used blocks / total blocks."""
        return self.num_used / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, trace: Trace, num_tokens: int) -> int:
        """Blocks ``trace`` must gain to hold ``num_tokens`` tokens in total."""
        return max(0, self.blocks_for(num_tokens) - len(trace.block_table))

    # -- allocation -------------------------------------------------------------------------
    def _take(self) -> int:
        b = self.free_blocks.pop()
        self.refcount[b] = 1
        return b

    def ensure(self, trace: Trace, num_tokens: int) -> None:
        """Grow ``trace``'s table to hold ``num_tokens`` tokens; all or nothing."""
        need = self.extra_blocks(trace, num_tokens)
        if need > self.num_free:
            raise OutOfBlocks(f"trace {trace.id} needs {need} blocks, {self.num_free} free")
        trace.block_table.extend(self._take() for _ in range(need))

    def truncate(self, trace: Trace, num_tokens: int) -> None:
        """Release blocks beyond what ``num_tokens`` tokens need (after tree verification)."""
        keep = self.blocks_for(num_tokens)
        for b in trace.block_table[keep:]:
            self._release(b)
        del trace.block_table[keep:]

    def fork(self, parent: Trace, child: Trace) -> tuple[int, int] | None:
        """Give ``child`` the parent's KV for its ``num_cached`` tokens.

        Shares every full block; allocates a fresh last block when the parent's last cached block
        is partial and returns ``(src, dst)`` for the caller to copy its slots. Raises OutOfBlocks
        (changing nothing) when that block cannot be had.
        """
        n = parent.num_cached
        full, partial = divmod(n, self.block_size)
        if partial and not self.free_blocks:
            raise OutOfBlocks(f"fork of trace {parent.id} needs 1 block, none free")
        shared = parent.block_table[:full]
        for b in shared:
            self.refcount[b] += 1
        child.block_table = list(shared)
        child.num_cached = n
        if partial:
            dst = self._take()
            child.block_table.append(dst)
            return parent.block_table[full], dst
        return None

    def free(self, trace: Trace) -> None:
        """Drop every block reference the trace holds (finish, abort, evict, preempt)."""
        for b in trace.block_table:
            self._release(b)
        trace.block_table = []
        trace.num_cached = 0
        trace.draft = None  # the drafter's KV and unread taps lived in those blocks

    def _release(self, b: int) -> None:
        rc = self.refcount[b]
        if rc <= 0:
            raise AssertionError(f"block {b} released with refcount {rc}")
        self.refcount[b] = rc - 1
        if rc == 1:
            self.free_blocks.append(b)

    def check(self, traces: list[Trace]) -> None:
        """Invariant check (tests): refcounts equal references and free blocks are unreferenced."""
        counts = [0] * self.num_blocks
        for t in traces:
            for b in t.block_table:
                counts[b] += 1
        if counts != self.refcount:
            bad = [i for i in range(self.num_blocks) if counts[i] != self.refcount[i]][:5]
            raise AssertionError(f"refcount mismatch at blocks {bad}")
        free = set(self.free_blocks)
        if len(free) != len(self.free_blocks):
            raise AssertionError("duplicate block in free list")
        if free != {i for i in range(self.num_blocks) if counts[i] == 0}:
            raise AssertionError("free list does not match unreferenced blocks")
