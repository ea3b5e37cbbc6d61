"""The in-place CPU decode kernel against PyTorch SDPA over gathered blocks, and in the engine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.attention import SeqInput, kernel_serves
from gambit.engine.cpu_attention import kernel, paged_attention, paged_decode

pytestmark = pytest.mark.skipif(kernel() is None, reason="no C++ toolchain to build the kernel")


def reference(q, kc, vc, tables, lens):
    B, H, D = q.shape
    Hkv = kc.shape[0]
    flat = tables.flatten()
    kg = kc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1)
    vg = vc.index_select(1, flat).view(Hkv, B, -1, D).transpose(0, 1)
    mask = (torch.arange(kg.shape[2])[None] < lens[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q[:, :, None], kg, vg, attn_mask=mask, enable_gqa=H != Hkv)
    return out[:, :, 0]


@pytest.mark.parametrize("H, Hkv, D, bs", [(4, 4, 48, 16), (8, 2, 32, 4), (6, 1, 16, 8), (2, 2, 64, 1),
                                       (9, 3, 64, 16), (10, 2, 32, 8)])  # SmolLM2: GQA 9/3, head_dim 64
def test_kernel_matches_sdpa_over_gathered_blocks(H, Hkv, D, bs):
    g = torch.Generator().manual_seed(H * 100 + Hkv)
    NB, B, nb = 64, 9, 7
    kc = torch.randn(Hkv, NB, bs, D, generator=g)
    vc = torch.randn(Hkv, NB, bs, D, generator=g)
    tables = torch.stack([torch.randperm(NB, generator=g)[:nb] for _ in range(B)])
    lens = torch.randint(1, nb * bs + 1, (B,), generator=g)
    lens[0] = 1  # a single key
    lens[1] = nb * bs  # every slot of every block
    q = torch.randn(B, H, D, generator=g)
    out = paged_decode(q, kc, vc, tables, lens, D ** -0.5)
    torch.testing.assert_close(out, reference(q, kc, vc, tables, lens), atol=2e-5, rtol=1e-4)


def _rows(S, ql_max, ctx_max, H, Hkv, D, bs, tree, g):
    """A ragged batch of multi-token rows: (q, caches, tables, ctx, qoff, qlen, moff, mask)."""
    ctx = torch.randint(0, ctx_max + 1, (S,), generator=g)
    ql = torch.randint(1, ql_max + 1, (S,), generator=g)
    ql[0] = ql_max  # one sequence spans several of the kernel's row chunks
    nb = int(((ctx + ql + bs - 1) // bs).max())
    NB = S * nb + 1
    kc, vc = torch.randn(Hkv, NB, bs, D, generator=g), torch.randn(Hkv, NB, bs, D, generator=g)
    tables = (torch.randperm(NB - 1, generator=g)[: S * nb] + 1).view(S, nb)
    masks, moff, m = [], [], 0
    for b in range(S):
        if not tree:
            moff.append(-1)
            continue
        n = int(ql[b])
        mk = (torch.rand(n, n, generator=g) < 0.3) | torch.eye(n, dtype=torch.bool)
        masks.append(mk.reshape(-1))
        moff.append(m)
        m += n * n
    mask = torch.cat(masks) if masks else torch.zeros(1, dtype=torch.bool)
    q = torch.randn(int(ql.sum()), H, D, generator=g)
    return q, kc, vc, tables, ctx, torch.cumsum(ql, 0) - ql, ql, torch.tensor(moff), mask


def _one(n: int, value: int = 0) -> torch.Tensor:
    return torch.full((n,), value, dtype=torch.long)


@pytest.mark.parametrize("H, Hkv, D, bs", [(4, 4, 48, 16), (9, 3, 64, 16), (8, 2, 32, 4)])
def test_multi_row_kernel_causal_rows_equal_each_row_alone(H, Hkv, D, bs):
    """A sequence's rows share each loaded key (chunks of up to 16 rows), yet causal row i's floats are
    bit for bit those of one row with ctx + i cached keys (what a decode step computes)."""
    g = torch.Generator().manual_seed(7)
    q, kc, vc, tables, ctx, qoff, ql, moff, mask = _rows(4, 37, 70, H, Hkv, D, bs, False, g)
    out = paged_attention(q, kc, vc, tables, ctx, qoff, ql, moff, mask, D ** -0.5)
    for b in range(len(ctx)):
        for i in range(int(ql[b])):
            row = int(qoff[b]) + i
            alone = paged_attention(q[row:row + 1], kc, vc, tables[b:b + 1], ctx[b:b + 1] + i,
                                    _one(1), _one(1, 1), _one(1, -1), mask, D ** -0.5)
            assert torch.equal(out[row], alone[0]), (b, i)


@pytest.mark.parametrize("H, Hkv, D, bs", [(4, 4, 48, 16), (9, 3, 64, 16), (8, 2, 32, 4)])
def test_multi_row_kernel_tree_rows(H, Hkv, D, bs):
    """Tree rows see their cached keys and the new keys their mask row sets (SDPA over those keys, to
    rounding); a row's floats do not depend on the other sequences or on which rows share its chunk
    (the rows reversed, mask rows with them)."""
    g = torch.Generator().manual_seed(8)
    q, kc, vc, tables, ctx, qoff, ql, moff, mask = _rows(4, 37, 70, H, Hkv, D, bs, True, g)
    out = paged_attention(q, kc, vc, tables, ctx, qoff, ql, moff, mask, D ** -0.5)
    for b in range(len(ctx)):
        c, n, m0 = int(ctx[b]), int(ql[b]), int(moff[b])
        keys = torch.arange(c + n)
        kg, vg = kc[:, tables[b, keys // bs], keys % bs], vc[:, tables[b, keys // bs], keys % bs]
        rows = slice(int(qoff[b]), int(qoff[b]) + n)
        sub = mask[m0: m0 + n * n].view(n, n)
        for i in range(n):
            seen = torch.cat([torch.arange(c), c + sub[i].nonzero().flatten()])
            G = H // Hkv
            ref = F.scaled_dot_product_attention(q[rows][i][:, None], kg[:, seen].repeat_interleave(G, 0),
                                                 vg[:, seen].repeat_interleave(G, 0))[:, 0]
            torch.testing.assert_close(out[rows][i], ref, atol=2e-5, rtol=1e-4)
        alone = paged_attention(q[rows].contiguous(), kc, vc, tables[b:b + 1], ctx[b:b + 1], _one(1),
                                ql[b:b + 1], _one(1), sub.flatten().contiguous(), D ** -0.5)
        assert torch.equal(out[rows], alone)
        rev = paged_attention(q[rows].flip(0).contiguous(), kc, vc, tables[b:b + 1], ctx[b:b + 1],
                              _one(1), ql[b:b + 1], _one(1), sub.flip(0).flatten().contiguous(), D ** -0.5)
        assert torch.equal(out[rows], rev.flip(0))


# G = H / Hkv from 1 to 8: the decode kernel's value pass takes up to 4 heads at once (2 at D = 128), so
# groups of 5 and 8 heads take it in two chunks
@pytest.mark.parametrize("H, Hkv, D, bs", [(9, 3, 64, 16), (4, 4, 48, 32), (8, 2, 128, 16), (6, 2, 32, 8),
                                           (10, 2, 32, 8), (16, 2, 64, 16), (6, 1, 128, 16)])
def test_one_row_attention_equals_the_decode_kernel(H, Hkv, D, bs):
    """A decode row in a forward with trees goes through the multi-row kernel: the same floats as
    ``paged_decode``, so a plain trace's tokens do not depend on what shares its batch (paged_decode
    reduces sixteen keys' dot products at once, score_key one at a time: the same pairs, bit for bit)."""
    g = torch.Generator().manual_seed(3)
    S = 6
    ctx = torch.randint(0, 200, (S,), generator=g)
    nb = int(((ctx + bs) // bs).max())
    kc = torch.randn(Hkv, S * nb + 1, bs, D, generator=g)
    vc = torch.randn(Hkv, S * nb + 1, bs, D, generator=g)
    tables = (torch.randperm(S * nb, generator=g) + 1).view(S, nb)
    q = torch.randn(S, H, D, generator=g)
    ones = torch.ones(S, dtype=torch.long)
    rows = paged_attention(q, kc, vc, tables, ctx, torch.arange(S), ones, -ones,
                           torch.zeros(1, dtype=torch.bool), D ** -0.5)
    assert torch.equal(rows, paged_decode(q, kc, vc, tables, ctx + 1, D ** -0.5))


def test_kernel_serves_trees_and_keeps_plain_prefill_on_sdpa(monkeypatch):
    """Plain decoding keeps the rule its pinned floats were made with (SDPA above 12 new tokens);
    draft trees (masked rows) and the drafter's context pass take the kernel at any size (its tiled
    order measured faster than SDPA everywhere), unless switched off for an A/B."""
    def item(q, tree=False):
        mask = torch.ones(q, q, dtype=torch.bool) if tree else None
        return SeqInput([0] * q, list(range(q)), 5, [1, 2], mask)

    assert kernel_serves([item(12)]) and not kernel_serves([item(13)])  # a prompt's prefill
    assert kernel_serves([item(49, tree=True)])  # one paper-size tree: 49 rows in all
    assert kernel_serves([item(4, tree=True)] * 48 + [item(1)] * 40)  # many small trees and decode rows
    assert kernel_serves([item(17, tree=True)] * 4) and kernel_serves([item(49, tree=True)] * 16)
    assert not kernel_serves([item(4, tree=True)] * 8 + [item(30)])  # a prompt among trees: SDPA
    assert kernel_serves([item(6)] * 40, speculative=True) and not kernel_serves([item(6)] * 40)
    monkeypatch.setattr("gambit.engine.attention.SPECULATIVE_ROWS_IN_KERNEL", False)
    assert not kernel_serves([item(49, tree=True)]) and kernel_serves([item(12, tree=True)])


@pytest.mark.parametrize("H, Hkv, D, bs", [(4, 4, 48, 16), (9, 3, 64, 16), (8, 2, 36, 4)])
def test_tiled_causal_rows(H, Hkv, D, bs):
    """Causal rows of a speculative forward (``moff`` -2, the drafter's context pass) take the tiled
    order: SDPA over ctx + i + 1 keys to rounding, and a row's floats do not depend on the rows or
    sequences beside it (each row alone, with its ctx + i keys, is bit for bit the same), also with a
    head_dim off the kernel's 8-dim register blocks (36)."""
    g = torch.Generator().manual_seed(9)
    q, kc, vc, tables, ctx, qoff, ql, moff, mask = _rows(4, 37, 70, H, Hkv, D, bs, False, g)
    out = paged_attention(q, kc, vc, tables, ctx, qoff, ql, torch.full_like(moff, -2), mask, D ** -0.5)
    plain = paged_attention(q, kc, vc, tables, ctx, qoff, ql, moff, mask, D ** -0.5)
    torch.testing.assert_close(out, plain, atol=2e-6, rtol=1e-5)
    G = H // Hkv
    for b in range(len(ctx)):
        c = int(ctx[b])
        for i in range(int(ql[b])):
            row = int(qoff[b]) + i
            keys = torch.arange(c + i + 1)
            kg, vg = kc[:, tables[b, keys // bs], keys % bs], vc[:, tables[b, keys // bs], keys % bs]
            ref = F.scaled_dot_product_attention(q[row][:, None], kg.repeat_interleave(G, 0),
                                                 vg.repeat_interleave(G, 0))[:, 0]
            torch.testing.assert_close(out[row], ref, atol=2e-5, rtol=1e-4)
            alone = paged_attention(q[row:row + 1], kc, vc, tables[b:b + 1], ctx[b:b + 1] + i,
                                    _one(1), _one(1, 1), _one(1, -2), mask, D ** -0.5)
            assert torch.equal(out[row], alone[0]), (b, i)


def test_tiled_softmax_handles_extreme_scores():
    """The tiled order's exp: a key far above the rest takes all the weight (the others underflow to
    exactly 0, not to NaN), and equal scores split it evenly."""
    Hkv, bs, D = 1, 16, 8
    kc = torch.zeros(Hkv, 3, bs, D)
    vc = torch.arange(3 * bs, dtype=torch.float32).repeat_interleave(D).view(Hkv, 3, bs, D)
    kc[0, 1, 3] = 1000.0  # key 3 of block 1 (the sequence's first block): huge against q = 1
    q = torch.ones(1, 1, D)
    tables = torch.tensor([[1, 2]])
    no_mask = torch.zeros(1, dtype=torch.bool)
    args = (tables, torch.tensor([20]), _one(1), _one(1, 1), _one(1, -2), no_mask, 1.0)
    out = paged_attention(q, kc, vc, *args)
    assert torch.equal(out[0, 0], vc[0, 1, 3])
    kc[0, 1, 3] = 0.0
    even = paged_attention(q, kc, vc, *args)  # 21 keys of score 0: the mean of their values
    ref = torch.cat([vc[0, 1], vc[0, 2, :5]]).mean(0)
    torch.testing.assert_close(even[0, 0], ref)


def test_kernel_ignores_slots_past_the_length():
    Hkv, NB, bs, D = 2, 8, 4, 16
    kc, vc = torch.randn(Hkv, NB, bs, D), torch.randn(Hkv, NB, bs, D)
    tables, lens, q = torch.tensor([[3, 5]]), torch.tensor([6]), torch.randn(1, 2, D)
    before = paged_decode(q, kc, vc, tables, lens, 0.25)
    kc[:, 5, 2:] = 1e4  # garbage beyond token 6 (block 5, offsets 2, 3) and in unused blocks
    vc[:, 0] = float("nan")
    assert torch.equal(paged_decode(q, kc, vc, tables, lens, 0.25), before)


def test_engine_same_tokens_with_and_without_kernel(tiny):
    model, tok = tiny
    prompts = ["Compute 12+7*3.\nSolution:\n", "abc", "Compute (5+5)*9-3.\nSolution:\n" * 3]
    params = SamplingParams(temperature=0.7, seed=3, max_tokens=24, ignore_eos=True)
    outs = []
    for use in (True, False):
        eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", block_size=4, num_blocks=64,
                                              cpu_kernel=use))
        assert eng.runner.use_kernel is use
        outs.append(eng.generate(prompts, params))
    assert outs[0] == outs[1]


def test_rms_norm_kernel_matches_torch():
    from gambit.engine.cpu_attention import rms_norm

    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1, 192), (2, 9, 192), (5, 64), (1, 3, 576)]:
        x = torch.randn(*shape, generator=g) * 3
        w = torch.randn(shape[-1], generator=g)
        ref = F.rms_norm(x, (shape[-1],), w, 1e-6)
        torch.testing.assert_close(rms_norm(x, w, 1e-6), ref, atol=1e-5, rtol=1e-5)
    x = torch.randn(9, 2, 192, generator=g).transpose(0, 1)  # not contiguous
    w = torch.randn(192, generator=g)
    torch.testing.assert_close(rms_norm(x, w, 1e-6), F.rms_norm(x, (192,), w, 1e-6), atol=1e-5, rtol=1e-5)


def test_kernels_release_the_gil_while_they_run():
    """A long kernel call leaves the GIL to the process's other threads (a replica's event loop, the
    writer and RPC threads): the main thread keeps running during it, with no gap as long as a call."""
    import threading
    import time

    g = torch.Generator().manual_seed(0)
    Hkv, NB, bs, D, B = 4, 1024, 16, 64, 32
    kc, vc = torch.randn(Hkv, NB, bs, D, generator=g), torch.randn(Hkv, NB, bs, D, generator=g)
    tables = torch.randint(0, NB, (B, NB), generator=g)
    lens = torch.full((B,), NB * bs)
    q = torch.randn(B, Hkv, D, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the other core stays free for the main thread
    try:
        t = time.perf_counter()
        paged_decode(q, kc, vc, tables, lens, D ** -0.5)
        call = time.perf_counter() - t
        if call < 0.03:  # a faster CPU: more sequences, so that one call lasts ~60 ms
            B = min(1024, int(B * 0.06 / call) + 1)
            tables = torch.randint(0, NB, (B, NB), generator=g)
            lens, q = torch.full((B,), NB * bs), torch.randn(B, Hkv, D, generator=g)
            t = time.perf_counter()
            paged_decode(q, kc, vc, tables, lens, D ** -0.5)
            call = time.perf_counter() - t
        done = threading.Event()

        def work():
            torch.set_num_threads(1)
            for _ in range(4):
                paged_decode(q, kc, vc, tables, lens, D ** -0.5)
            done.set()

        th = threading.Thread(target=work)
        start = last = time.perf_counter()
        th.start()
        stalled = 0.0  # time lost in gaps longer than 5 ms: a held GIL loses all four calls
        while not done.is_set():
            now = time.perf_counter()
            if now - last > 0.005:
                stalled += now - last
            last = now
        th.join()
        total = time.perf_counter() - start
    finally:
        torch.set_num_threads(before)
    assert call > 0.02, f"the call took {call * 1e3:.1f} ms: too short to tell"
    # The sum, not the longest gap: one scheduler preemption on a loaded 2-core machine can stall
    # the main thread for most of a call without the kernel holding the GIL.
    assert stalled < total / 2, f"main thread stalled {stalled * 1e3:.1f} of {total * 1e3:.1f} ms"


@pytest.mark.parametrize("H, Hkv, D", [(4, 4, 48), (9, 3, 64), (4, 2, 20)])
def test_dense_attention_equals_sdpa(H, Hkv, D):
    """The drafter's tree-step attention (dense buffers, an additive mask: ``TreeAttention``) in the
    tiled order: SDPA's result to rounding, only the first n keys read, and a row's floats the same
    alone as among the others (19 rows: two row chunks)."""
    from gambit.engine.cpu_attention import dense_attention

    g = torch.Generator().manual_seed(11)
    B, T, W, n = 3, 19, 50, 41
    q = torch.randn(B, T, H, D, generator=g)
    k, v = torch.randn(B, Hkv, W, D, generator=g), torch.randn(B, Hkv, W, D, generator=g)
    buf = torch.where(torch.rand(B, T, W, generator=g) < 0.3, float("-inf"), 0.0)
    buf[:, :, 0] = 0.0  # every row sees a key
    mask = buf[:, None, :, :n]  # the strided view TreeAttention passes
    out = dense_attention(q, k, v, n, mask, D ** -0.5)
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k[:, :, :n], v[:, :, :n], attn_mask=mask,
                                         enable_gqa=H != Hkv).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)
    k[:, :, n:] = float("nan")  # past n: never read
    assert torch.equal(dense_attention(q, k, v, n, mask, D ** -0.5), out)
    for i in (0, 17):
        alone = dense_attention(q[:, i:i + 1], k, v, n, buf[:, None, i:i + 1, :n], D ** -0.5)
        assert torch.equal(alone[:, 0], out[:, i])
