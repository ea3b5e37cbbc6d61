"""Paged attention against dense attention computed by hand, and the KV moves tree verification needs.

A tree item brings ``q`` draft nodes with an ``[q, q]`` ancestor-or-self mask: node ``i`` must see
every cached token of its sequence, its ancestors and itself, and nothing else. Ragged batches
mixing decode rows, causal multi-token rows and tree rows must equal attention done per sequence.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from engine_util import slot_major

from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.block_manager import BlockManager, OutOfBlocks
from gambit.engine.kv_cache import KVCache
from gambit.engine.model_runner import ModelRunner
from gambit.engine.sequence import SamplingParams, Trace
from gambit.model import ModelConfig

H, HKV, D, LAYERS, BS, NB = 4, 2, 8, 2, 4, 32
CFG = ModelConfig(vocab_size=16, hidden_size=H * D, intermediate_size=8, num_hidden_layers=LAYERS,
                  num_attention_heads=H, num_key_value_heads=HKV)
ATOL = 1e-5


def _cache() -> KVCache:
    return KVCache(CFG, NB, BS, torch.float32, torch.device("cpu"))


def _rand(g, n, heads):
    return torch.randn(1, n, heads, D, generator=g)


def _dense(q, k, v, allowed):
    """By hand: q [n, H, D], k/v [m, Hkv, D], allowed [n, m] bool → [n, H, D]."""
    rep = H // HKV
    k = k.repeat_interleave(rep, dim=1)  # query head h reads kv head h // rep
    v = v.repeat_interleave(rep, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(D)
    s = s.masked_fill(~allowed[None], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v)


def _tree_mask(parents: list[int]) -> torch.Tensor:
    """[q, q] ancestor-or-self mask from parent indices (-1 = child of the cached context)."""
    q = len(parents)
    m = torch.zeros(q, q, dtype=torch.bool)
    for i in range(q):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def _kernels() -> list[bool]:
    """Attention paths to test: the PyTorch one, and the CPU decode kernel when there is one."""
    if "use_kernel" not in inspect.signature(PagedAttention).parameters:
        return [False]
    from gambit.engine import cpu_attention

    return [False, True] if cpu_attention.kernel() is not None else [False]


def _run(cache, items, layer, g, use_kernel=False):
    """One PagedAttention call with random q/k/v for the items' new tokens; returns (out, q, k, v)."""
    n = sum(it.q for it in items)
    q, k, v = _rand(g, n, H), _rand(g, n, HKV), _rand(g, n, HKV)
    kw = {"use_kernel": True} if use_kernel else {}
    out = PagedAttention(cache, items, torch.device("cpu"), **kw)(layer, q, k, v)
    assert out.shape == (1, n, H, D)
    return out[0], q[0], k[0], v[0]


def _item(n_new, ctx, table, mask=None):
    return SeqInput([1] * n_new, list(range(ctx, ctx + n_new)), ctx, table, mask)


def _prefill(cache, specs, g, layer=0):
    """Fill each (ctx, table) with ctx random cached tokens; returns their k/v and checks causal output."""
    items = [_item(ctx, 0, table) for ctx, table in specs]
    out, q, k, v = _run(cache, items, layer, g)
    kv, off = [], 0
    for ctx, _ in specs:
        sl = slice(off, off + ctx)
        causal = torch.ones(ctx, ctx, dtype=torch.bool).tril()
        assert torch.allclose(out[sl], _dense(q[sl], k[sl], v[sl], causal), atol=ATOL)
        kv.append((k[sl], v[sl]))
        off += ctx
    return kv


TABLES = [[7, 2, 9, 5, 30], [0, 11, 3, 20, 21], [12, 13, 4, 8, 1], [25, 6, 14, 31, 15]]


@pytest.mark.parametrize("use_kernel", _kernels())
@pytest.mark.parametrize("layer", [0, 1])
def test_tree_masks_equal_dense_attention(layer, use_kernel):
    g = torch.Generator().manual_seed(layer)
    cache = _cache()
    ctxs = [6, 4, 9]  # 4 is a block multiple: the tree starts a fresh block
    kv = _prefill(cache, list(zip(ctxs, TABLES, strict=False)), g, layer)
    trees = [
        [-1, 0, 0, 1, 1, 2, 5],  # a binary-ish tree of 7 nodes
        [-1, -1, 0, 1, 2],  # two roots (siblings at depth 1), one grows a chain
        [-1, 0, 1, 2],  # a chain: equals causal
    ]
    items = [_item(len(p), c, TABLES[i], _tree_mask(p))
             for i, (p, c) in enumerate(zip(trees, ctxs, strict=True))]
    out, q, k, v = _run(cache, items, layer, g, use_kernel)
    off = 0
    for (ck, cv), parents, ctx in zip(kv, trees, ctxs, strict=True):
        n = len(parents)
        sl = slice(off, off + n)
        allowed = torch.cat([torch.ones(n, ctx, dtype=torch.bool), _tree_mask(parents)], dim=1)
        keys, vals = torch.cat([ck, k[sl]]), torch.cat([cv, v[sl]])
        assert torch.allclose(out[sl], _dense(q[sl], keys, vals, allowed), atol=ATOL), parents
        # and the mask matters: plain causal attention over the nodes gives something else
        if parents != [-1, 0, 1, 2]:
            tril = torch.ones(n, n, dtype=torch.bool).tril()
            causal = torch.cat([torch.ones(n, ctx, dtype=torch.bool), tril], 1)
            assert not torch.allclose(out[sl], _dense(q[sl], keys, vals, causal), atol=1e-3)
        off += n
    # the nodes' keys and values went to their slots: ctx + i in the sequence's block table
    for layer_kv, new in ((cache.k, k), (cache.v, v)):
        slots = slot_major(layer_kv, NB, BS)[layer]
        off = 0
        for parents, ctx, table in zip(trees, ctxs, TABLES, strict=False):
            for i in range(len(parents)):
                pos = ctx + i
                assert torch.equal(slots[table[pos // BS] * BS + pos % BS], new[off + i])
            off += len(parents)


@pytest.mark.parametrize("use_kernel", _kernels())
def test_ragged_mixed_batch_equals_per_sequence_sdpa(use_kernel):
    g = torch.Generator().manual_seed(3)
    cache = _cache()
    ctxs = [5, 8, 3, 11]
    kv = _prefill(cache, list(zip(ctxs, TABLES, strict=True)), g)
    news = [1, 3, 1, 6]  # decode rows and multi-token rows interleaved
    items = [_item(n, c, t) for n, c, t in zip(news, ctxs, TABLES, strict=True)]
    out, q, k, v = _run(cache, items, 0, g, use_kernel)
    off = 0
    for (ck, cv), n, ctx in zip(kv, news, ctxs, strict=True):
        sl = slice(off, off + n)
        keys, vals = torch.cat([ck, k[sl]]), torch.cat([cv, v[sl]])
        allowed = torch.arange(ctx + n)[None, :] <= (ctx + torch.arange(n))[:, None]
        ref = F.scaled_dot_product_attention(q[sl].transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                             vals.transpose(0, 1)[None], attn_mask=allowed,
                                             enable_gqa=True)[0].transpose(0, 1)
        assert torch.allclose(out[sl], ref, atol=ATOL), (n, ctx)
        assert torch.allclose(out[sl], _dense(q[sl], keys, vals, allowed), atol=ATOL)
        off += n


@pytest.mark.parametrize("use_kernel", _kernels())
def test_pure_decode_batch(use_kernel):
    g = torch.Generator().manual_seed(4)
    cache = _cache()
    ctxs = [7, 1, 4, 12]
    kv = _prefill(cache, list(zip(ctxs, TABLES, strict=True)), g)
    out, q, k, v = _run(cache, [_item(1, c, t) for c, t in zip(ctxs, TABLES, strict=True)], 0, g, use_kernel)
    for i, ((ck, cv), ctx) in enumerate(zip(kv, ctxs, strict=True)):
        ref = _dense(q[i:i + 1], torch.cat([ck, k[i:i + 1]]), torch.cat([cv, v[i:i + 1]]),
                     torch.ones(1, ctx + 1, dtype=torch.bool))
        assert torch.allclose(out[i:i + 1], ref, atol=ATOL)


def test_tree_through_the_model_matches_dense_paths(tiny):
    """ModelRunner with a tree item: each node's logits equal a dense forward over its root path."""
    model, _ = tiny
    runner = ModelRunner(model, 16, BS, torch.device("cpu"), torch.float32)
    prefix = [1, 40, 41, 42, 43, 44, 45]
    table = [3, 9, 0, 12, 5]
    runner.forward([SeqInput(prefix, list(range(len(prefix))), 0, table)], [len(prefix) - 1])
    parents = [-1, 0, 0, 1, 2, 2, -1]
    tokens = [50, 51, 52, 53, 54, 55, 56]
    depth = [0] * len(parents)
    for i, p in enumerate(parents):
        depth[i] = 0 if p < 0 else depth[p] + 1
    ctx = len(prefix)
    item = SeqInput(tokens, [ctx + d for d in depth], ctx, table, _tree_mask(parents))
    out = runner.forward([item], list(range(len(tokens))))
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.insert(0, tokens[j])
            j = parents[j]
        with torch.no_grad():
            h, _ = model(torch.tensor([prefix + path]))
            ref = model.logits(h[0, -1]).float()
        assert torch.allclose(out.logits[i], ref, atol=1e-4), i
        assert torch.allclose(out.hidden[i], h[0, -1], atol=1e-4)


def _fill(cache, g):
    """Random distinct values in every slot of every layer."""
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))


def test_move_slots_copies_every_layer():
    g = torch.Generator().manual_seed(5)
    cache = _cache()
    _fill(cache, g)
    before_k = slot_major(cache.k, NB, BS).clone()
    before_v = slot_major(cache.v, NB, BS).clone()
    src = torch.tensor([9, 17, 40, 3])
    dst = torch.tensor([8, 9, 10, 100])  # dst 9 is also a src: sources are read before writing
    cache.move_slots(src, dst)
    after_k, after_v = slot_major(cache.k, NB, BS), slot_major(cache.v, NB, BS)
    for before, after in ((before_k, after_k), (before_v, after_v)):
        assert torch.equal(after[:, dst], before[:, src])
        others = torch.ones(NB * BS, dtype=torch.bool)
        others[dst] = False
        assert torch.equal(after[:, others], before[:, others])


@pytest.mark.parametrize("use_kernel", _kernels())
def test_accept_tree_path_then_decode(use_kernel):
    """Verify a tree, keep one root-to-leaf path (move_slots + truncate), decode: equals dense."""
    g = torch.Generator().manual_seed(6)
    cache = _cache()
    blocks = BlockManager(NB, BS)
    trace = Trace(0, [1] * 6, 6, SamplingParams(), seed=0)
    ctx = 6
    parents = [-1, 0, 0, 1, 2, 4]  # path 0 → 2 → 4 → 5 accepted
    blocks.ensure(trace, ctx + len(parents))
    ((ck, cv),) = _prefill(cache, [(ctx, trace.block_table)], g)
    out, q, k, v = _run(cache, [_item(len(parents), ctx, trace.block_table, _tree_mask(parents))], 0, g)
    accepted = [0, 2, 4]  # node 5 rejected as well: keep three
    table = trace.block_table

    def slot(pos):
        return table[pos // BS] * BS + pos % BS

    cache.move_slots(torch.tensor([slot(ctx + i) for i in accepted]),
                     torch.tensor([slot(ctx + j) for j in range(len(accepted))]))
    n_keep = ctx + len(accepted)
    blocks.truncate(trace, n_keep)
    assert len(trace.block_table) == -(-n_keep // BS)
    blocks.check([trace])
    # decode one more token after the accepted path: sees ctx + accepted nodes (their k/v), itself
    blocks.ensure(trace, n_keep + 1)
    dout, dq, dk, dv = _run(cache, [_item(1, n_keep, trace.block_table)], 0, g, use_kernel)
    keys = torch.cat([ck, k[accepted], dk])
    vals = torch.cat([cv, v[accepted], dv])
    ref = _dense(dq, keys, vals, torch.ones(1, n_keep + 1, dtype=torch.bool))
    assert torch.allclose(dout, ref, atol=ATOL)


def _trace(tid, n):
    return Trace(tid, [1] * n, n, SamplingParams(), seed=0)


def test_truncate_releases_tail_blocks():
    bm = BlockManager(12, 4)
    t = _trace(0, 20)
    bm.ensure(t, 20)
    assert len(t.block_table) == 5 and bm.num_used == 5
    table = list(t.block_table)
    bm.truncate(t, 9)  # 9 tokens need 3 blocks
    assert t.block_table == table[:3] and bm.num_used == 3
    assert all(bm.refcount[b] == 0 for b in table[3:]) and all(b in bm.free_blocks for b in table[3:])
    bm.truncate(t, 12)  # exactly 3 blocks: nothing to drop
    assert t.block_table == table[:3]
    bm.truncate(t, 40)  # more than it has: nothing changes
    assert t.block_table == table[:3] and bm.num_used == 3
    bm.check([t])
    bm.truncate(t, 0)
    assert t.block_table == [] and bm.num_used == 0
    bm.check([t])
    assert bm.usage() == 0.0


def test_truncate_shared_blocks_keeps_them_for_the_other_holder():
    bm = BlockManager(12, 4)
    parent, child = _trace(0, 13), _trace(1, 13)
    bm.ensure(parent, 13)
    parent.num_cached = 13  # 3 full blocks + 1 partial
    assert bm.fork(parent, child) == (parent.block_table[3], child.block_table[3])
    assert [bm.refcount[b] for b in parent.block_table] == [2, 2, 2, 1]
    bm.truncate(child, 5)  # child keeps 2 shared blocks, drops one shared and its own copy
    assert child.block_table == parent.block_table[:2]
    assert [bm.refcount[b] for b in parent.block_table] == [2, 2, 1, 1]
    assert bm.num_used == 4
    bm.check([parent, child])
    bm.free(child)
    bm.free(parent)
    assert bm.num_used == 0 and bm.refcount == [0] * 12
    bm.check([parent, child])


def test_ensure_and_fork_are_all_or_nothing():
    bm = BlockManager(4, 4)
    a, b, c = _trace(0, 10), _trace(1, 10), _trace(2, 10)
    bm.ensure(a, 10)  # 3 blocks
    with pytest.raises(OutOfBlocks):
        bm.ensure(b, 8)  # needs 2, 1 free
    assert b.block_table == [] and bm.num_free == 1
    bm.ensure(b, 4)
    a.num_cached = 10  # partial last block, no free block for the child's copy
    with pytest.raises(OutOfBlocks):
        bm.fork(a, c)
    assert c.block_table == [] and c.num_cached == 0
    assert [bm.refcount[x] for x in a.block_table] == [1, 1, 1]
    bm.check([a, b, c])
    a.num_cached = 8  # a block multiple: a fork needs no block at all
    assert bm.fork(a, c) is None
    assert c.block_table == a.block_table[:2] and c.num_cached == 8
    bm.check([a, b, c])
    bm.free(c)
    bm.free(c)  # freeing twice is harmless: the table is empty after the first
    bm.check([a, b, c])
    last = b.block_table[0]
    bm.free(b)
    with pytest.raises(AssertionError):
        bm._release(last)  # a free block released again
    bm.check([a, b, c])
