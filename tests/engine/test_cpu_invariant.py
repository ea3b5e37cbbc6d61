"""Batch-invariant arithmetic (``EngineConfig.batch_invariant``): products whose rows' floats are those of
each row alone, tree rows in the one-row attention order, and an engine whose greedy tokens then do not
depend on the batch, the prefill chunking, or speculative verification, with bfloat16 weights and KV."""

from __future__ import annotations

import pytest
import torch
from engine_util import SHIPPED
from test_cpu_attention import _rows

from gambit.engine import Engine, EngineConfig, SamplingParams, cpu_attention, cpu_invariant
from gambit.engine.cpu_attention import paged_attention, paged_decode
from gambit.engine.linear import PackedLinear, bf16_gemm_available, install_cpu_linears
from gambit.model import load_model
from gambit.speculative import load_drafter

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")

SHAPES = [(576, 960), (577, 100), (64, 130), (1536, 576), (48, 49152 // 8)]


def _weight(n_in: int, n_out: int, bf16: bool, seed: int) -> torch.Tensor:
    w = torch.randn(n_out, n_in, generator=torch.Generator().manual_seed(seed)) * n_in ** -0.5
    return w.bfloat16().float() if bf16 else w


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("n_in, n_out", SHAPES)
def test_each_row_is_the_row_alone_and_the_plain_code(n_in, n_out, bf16):
    w = _weight(n_in, n_out, bf16, n_in + n_out)
    packed = cpu_invariant.pack(w.t(), bf16)
    x = torch.randn(13, n_in, generator=torch.Generator().manual_seed(1))
    x[3] = 0.0
    x[4, ::7] = 1e-39  # bfloat16 denormals once rounded: read as zero, as vdpbf16ps does
    y = cpu_invariant.linear(x, packed, n_out)
    for r in range(13):  # alone, and in every row group (rows pass six at a time)
        assert torch.equal(cpu_invariant.linear(x[r:r + 1], packed, n_out)[0], y[r]), r
    assert torch.equal(cpu_invariant.linear(x[2:9], packed, n_out), y[2:9])
    assert torch.equal(cpu_invariant.linear(x, packed, n_out, simd=False), y)  # vector code = plain code
    xr = x.bfloat16().float() if bf16 else x
    ref = (xr.double() @ w.t().double()).float()
    if bf16:  # each sum rounded to bfloat16 once: within one bfloat16 ulp of the exact product's rounding
        ulp = ref.abs().clamp_min(1e-30) * 2.0 ** -7
        assert ((y - ref).abs() <= ulp + 1e-6).all()
    else:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_split_over_threads_keep_their_floats(threads, bf16):
    """With few tiles (here 3: the shipped target's o and down) the rows are split over the threads too;
    every row keeps the floats it has alone, on one thread or two."""
    n = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = _weight(192, 192, bf16, 5)
        packed = cpu_invariant.pack(w.t(), bf16)
        x = torch.randn(130, 192, generator=torch.Generator().manual_seed(2))
        y = cpu_invariant.linear(x, packed, 192)
        alone = torch.cat([cpu_invariant.linear(x[r:r + 1], packed, 192) for r in range(130)])
        assert torch.equal(y, alone)
        assert torch.equal(cpu_invariant.linear(x[5:101], packed, 192), y[5:101])
    finally:
        torch.set_num_threads(n)


def test_shapes_and_rows_are_checked():
    packed = cpu_invariant.pack(torch.randn(64, 100), False)
    with pytest.raises(RuntimeError, match="packed weight of another shape"):
        cpu_invariant.linear(torch.randn(2, 63), packed, 100)
    with pytest.raises(RuntimeError, match="fp32 rows"):
        cpu_invariant.linear(torch.randn(2, 64).double(), packed, 100)
    empty = cpu_invariant.linear(torch.randn(0, 64), packed, 100)
    assert empty.shape == (0, 100)


def test_packed_linear_serves_every_row_count_with_its_bias():
    w, b = _weight(96, 80, True, 3), torch.randn(80)
    lin = PackedLinear(w, b, 1, backend="invariant-bf16")
    x = torch.randn(5, 96)
    y = lin(x)
    assert torch.equal(y[1], lin(x[1:2])[0])
    torch.testing.assert_close(y, x.bfloat16().float() @ w.t() + b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("H, Hkv, D, bs", [(4, 4, 48, 16), (9, 3, 64, 16), (8, 2, 32, 4), (6, 2, 20, 8)])
@pytest.mark.parametrize("kv", [torch.float32, torch.bfloat16])
def test_tree_rows_in_the_one_row_order_are_plain_decoding_over_their_visible_keys(H, Hkv, D, bs, kv):
    """moff <= -3: each tree row's floats are those paged_decode gives one query over its cached keys
    followed by the new keys its mask row sets, in order: what plain decoding computes for the node's
    token once its ancestors are cached."""
    g = torch.Generator().manual_seed(D + bs)
    q, kc, vc, tables, ctx, qoff, ql, moff, mask = _rows(3, 29, 40, H, Hkv, D, bs, True, g)
    kc, vc = kc.to(kv), vc.to(kv)
    inv = torch.where(moff >= 0, -3 - moff, moff)
    out = paged_attention(q, kc, vc, tables, ctx, qoff, ql, inv, mask, D ** -0.5)
    tiled = paged_attention(q, kc, vc, tables, ctx, qoff, ql, moff, mask, D ** -0.5)
    torch.testing.assert_close(out, tiled, rtol=1e-5, atol=1e-5)  # the same attention, another order
    for b in range(len(ctx)):
        c, n = int(ctx[b]), int(ql[b])
        rows = mask[int(moff[b]):int(moff[b]) + n * n].view(n, n)
        for i in range(n):
            keys = list(range(c)) + [c + j for j in range(n) if rows[i, j]]
            slots = torch.tensor([int(tables[b, t // bs]) * bs + t % bs for t in keys])
            L = len(keys)
            nb = -(-L // bs)
            k1 = torch.zeros(Hkv, nb, bs, D, dtype=kv)
            v1 = torch.zeros(Hkv, nb, bs, D, dtype=kv)
            k1.view(Hkv, -1, D)[:, :L] = kc.view(Hkv, -1, D)[:, slots]
            v1.view(Hkv, -1, D)[:, :L] = vc.view(Hkv, -1, D)[:, slots]
            row = int(qoff[b]) + i
            alone = paged_decode(q[row:row + 1], k1, v1, torch.arange(nb)[None], torch.tensor([L]), D ** -0.5)
            assert torch.equal(out[row], alone[0]), (b, i)


def test_config_refuses_what_it_cannot_keep_invariant():
    for kw in ({"cpu_linear": "packed"}, {"cpu_kernel": False}, {"decode_graphs": "static"}):
        with pytest.raises(ValueError, match="batch_invariant needs"):
            EngineConfig(batch_invariant=True, **kw)


@pytest.fixture(scope="module")
def target():
    return load_model(SHIPPED, device="cpu", dtype="float32")


PROMPTS = ["Q: 3+4*2=?\nA:", "Q: (2+3)*4=?\nA:", "12", "Q: 8/2+6=?\nA:" * 3, "Q: 9*9-17=?\nA:",
           "Q: 7+(6*5)-4=?\nA:", "Q: 100/4=?\nA:", "Q: 2*3*4*5=?\nA:"]


def _greedy(eng: Engine, prompts, batch: int, decoding: str = "plain") -> list[list[int]]:
    out = []
    for i in range(0, len(prompts), batch):
        sp = SamplingParams(temperature=0, max_tokens=40, decoding=decoding)
        res = eng.generate(prompts[i:i + batch], sp)
        out += [list(getattr(r, "token_ids", r)) for r in res]
    return out


def test_engine_tokens_do_not_depend_on_batch_chunking_or_speculation(target):
    """Shipped target, bfloat16 weights and KV: plain decoding one at a time is the reference; a batch of
    8, prefill in 5-token chunks, and speculative decoding with the shipped EAGLE-3.1 and PR drafters (batch
    1 and 8) give the same tokens, and the engine's linears are the invariant ones."""
    model, tok = target
    prompts = [tok.encode(p) for p in PROMPTS]
    cfg = {"device": "cpu", "num_blocks": 512, "cpu_weights": "bfloat16", "kv_dtype": "bfloat16",
           "batch_invariant": True}
    eng = Engine(model, tok, EngineConfig(**cfg))
    assert eng.cpu_linear == "invariant-bf16"
    ref = _greedy(eng, prompts, 1)
    assert _greedy(eng, prompts, 8) == ref
    for name in ("drafter-eagle3.1", "drafter-pr"):
        path = str(SHIPPED.parent / name)
        eng.register_drafter(path, load_drafter(path, eng.model))
        assert _greedy(eng, prompts, 1, path) == ref, name
        assert _greedy(eng, prompts, 8, path) == ref, name
    assert eng.stats.spec_accepted > eng.stats.spec_drafts  # trees were accepted past their root
    chunked = Engine(model, tok, EngineConfig(**cfg, max_num_batched_tokens=5))
    assert _greedy(chunked, prompts, 8) == ref
    if bf16_gemm_available():  # the default engine's bf16 weights need oneDNN's bf16 GEMM (AVX2-only: none)
        plain = Engine(model, tok, EngineConfig(**{**cfg, "batch_invariant": False}))
        assert plain.cpu_linear != "invariant-bf16"


def test_install_refuses_without_the_transposed_layout(target):
    model, _ = target
    with pytest.raises(ValueError, match="batch_invariant needs"):
        install_cpu_linears(model, "packed", invariant=True)
