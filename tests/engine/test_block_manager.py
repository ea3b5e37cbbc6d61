"""The free list's order: a stack (the block freed last is the next one taken), blocks 0, 1, 2, ...
on a fresh manager; a fork right after a free copies its partial block into the block just freed."""

from __future__ import annotations

from gambit.engine.block_manager import BlockManager
from gambit.engine.sequence import SamplingParams, Trace


def _trace(tid: int, n: int) -> Trace:
    return Trace(tid, list(range(n)), n, SamplingParams(), seed=0)


def test_fresh_blocks_go_in_order_and_the_last_freed_comes_back_first():
    bm = BlockManager(num_blocks=8, block_size=4)
    a, b = _trace(0, 10), _trace(1, 5)
    bm.ensure(a, 10)
    bm.ensure(b, 5)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4]
    bm.free(a)  # released in table order: 0, 1, 2 — so 2 (its last, partial block) is on top
    c = _trace(2, 4)
    bm.ensure(c, 4)
    assert c.block_table == [2]
    b.num_cached = 5  # a partial last block (5 % 4): a fork copies it into the block on top now
    child = _trace(3, 5)
    assert bm.fork(b, child) == (4, 1)
    assert child.block_table == [3, 1] and bm.refcount[3] == 2
    bm.check([b, c, child])
