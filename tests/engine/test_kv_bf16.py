"""A bfloat16 KV cache (``EngineConfig.kv_dtype="bfloat16"``): keys and values rounded once, when written;
the CPU kernels widen them to fp32 as they read (exactly), so every float they compute equals what the
same kernel computes over an fp32 cache holding the rounded values."""

from __future__ import annotations

import pytest
import torch
from engine_util import SHIPPED
from test_cpu_attention import _rows

from gambit.engine import Engine, EngineConfig, SamplingParams, cpu_attention
from gambit.engine.config import SpecConfig
from gambit.engine.cpu_attention import paged_attention, paged_decode
from gambit.engine.kv_cache import bytes_per_block
from gambit.model import load_model
from gambit.speculative import random_drafter

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")

# (H, Hkv, D, bs); D = 20 takes the portable loops even with AVX-512
SHAPES = [(4, 4, 48, 16), (9, 3, 64, 16), (8, 2, 32, 4), (6, 2, 20, 8), (4, 1, 128, 16)]


def _halves(kc: torch.Tensor, vc: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(k bf16, v bf16, the same values as fp32)."""
    kh, vh = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    return kh, vh, kh.float(), vh.float()


@pytest.mark.parametrize("H, Hkv, D, bs", SHAPES)
def test_decode_over_bfloat16_blocks_is_the_fp32_kernel_over_the_rounded_values(H, Hkv, D, bs):
    g = torch.Generator().manual_seed(D + bs)
    NB, B, nb = 64, 9, 7
    kh, vh, kf, vf = _halves(*(torch.randn(Hkv, NB, bs, D, generator=g) for _ in range(2)))
    tables = torch.stack([torch.randperm(NB, generator=g)[:nb] for _ in range(B)])
    lens = torch.randint(1, nb * bs + 1, (B,), generator=g)
    lens[0], lens[1] = 1, nb * bs
    q = torch.randn(B, H, D, generator=g)
    out = paged_decode(q, kh, vh, tables, lens, D ** -0.5)
    assert out.dtype == torch.float32
    assert torch.equal(out, paged_decode(q, kf, vf, tables, lens, D ** -0.5))


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("H, Hkv, D, bs", SHAPES)
def test_multi_row_rows_over_bfloat16_blocks(H, Hkv, D, bs, tree):
    """Both orders (plain causal rows: one-row order; tree rows: tiled) read bf16 blocks exactly."""
    g = torch.Generator().manual_seed(3 * D + bs + tree)
    q, kc, vc, tables, ctx, qoff, ql, moff, mask = _rows(4, 37, 70, H, Hkv, D, bs, tree, g)
    kh, vh, kf, vf = _halves(kc, vc)
    args = (tables, ctx, qoff, ql, moff, mask, D ** -0.5)
    assert torch.equal(paged_attention(q, kh, vh, *args), paged_attention(q, kf, vf, *args))
    spec = torch.full_like(moff, -2) if not tree else moff  # causal rows in the tiled order
    args = (tables, ctx, qoff, ql, spec, mask, D ** -0.5)
    assert torch.equal(paged_attention(q, kh, vh, *args), paged_attention(q, kf, vf, *args))


def test_kernels_refuse_mixed_caches():
    q, kc = torch.randn(1, 2, 16), torch.randn(2, 4, 4, 16)
    tables, lens = torch.zeros(1, 1, dtype=torch.long), torch.ones(1, dtype=torch.long)
    for k, v in ((kc.bfloat16(), kc), (kc.half(), kc.half())):
        with pytest.raises(RuntimeError, match="float32 or bfloat16 KV cache"):
            paged_decode(q, k, v, tables, lens, 0.25)


@pytest.fixture(scope="module")
def target():
    return load_model(SHIPPED, device="cpu", dtype="float32")


PROMPTS = ["Q: 3+4*2=?\nA:", "Q: (2+3)*4=?\nA:", "12", "Q: 8/2+6=?\nA:" * 3]


def _engine(target, **kw) -> Engine:
    model, tok = target
    return Engine(model, tok, EngineConfig(device="cpu", num_blocks=256, **kw))


def test_engine_writes_rounded_keys_and_reads_them_in_every_path(target):
    """The C++ layer loop, the Python loop over the kernels and the PyTorch (SDPA) path give the same
    sampled tokens over a bf16 cache; the cache is bf16 and holds half the bytes of an fp32 one."""
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True)
    outs = []
    for kw in ({}, {"cpu_layers": False}, {"cpu_kernel": False}):
        eng = _engine(target, kv_dtype="bfloat16", **kw)
        assert eng.runner.cache.k.dtype == torch.bfloat16
        assert eng.runner.use_kernel is kw.get("cpu_kernel", True)
        outs.append(eng.generate(PROMPTS, params))
    assert outs[0] == outs[1] == outs[2]
    fp32 = _engine(target)
    assert fp32.runner.cache.k.nbytes == 2 * eng.runner.cache.k.nbytes


def test_bfloat16_keys_move_logits_by_rounding_only(target):
    """One prompt's last-position logits over a bf16 cache against an fp32 cache: close (keys and values
    carry 8 significant bits), not equal (the cache really is rounded)."""
    model, tok = target
    ids = tok.encode("Q: (7+5)*3-4=?\nA: 7+5=12. 12*3=36. 36-4=32.\n")
    logits = []
    for kv in ("float32", "bfloat16"):
        eng = _engine(target, kv_dtype=kv)
        out = eng.runner.forward([_item(ids)], [len(ids) - 1])
        logits.append(out.logits[0])
    assert not torch.equal(logits[0], logits[1])
    torch.testing.assert_close(logits[1], logits[0], atol=0.05, rtol=0.02)


def _item(ids: list[int]):
    from gambit.engine.attention import SeqInput

    return SeqInput(ids, list(range(len(ids))), 0, list(range((len(ids) + 15) // 16)))


@pytest.mark.parametrize("method", ["eagle", "pr"])
def test_speculative_decoding_over_bfloat16_kv_is_lossless(target, method):
    """Greedy speculative output (trees verified over the bf16 cache) equals plain greedy decoding over
    the same bf16 cache."""
    spec = SpecConfig(gamma=3, budget=10, grow_width=3, offer_width=3, reconsider=2 if method == "pr" else 0)
    outs = []
    for decoding in ("plain", "d"):
        eng = _engine(target, kv_dtype="bfloat16", spec=spec)
        if decoding == "d":
            eng.register_drafter("d", random_drafter(eng.model, seed=1))
        params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True,
                                **({"decoding": "d"} if decoding == "d" else {}))
        outs.append(eng.generate(PROMPTS, params))
    assert outs[0] == outs[1]


def test_budget_holds_twice_the_blocks(target):
    model, tok = target
    mc = model.config
    assert bytes_per_block(mc, 16, torch.bfloat16) * 2 == bytes_per_block(mc, 16, torch.float32)
    for drafters in (0, 1):  # a drafter's one-layer cache stays fp32 (the model's dtype)
        n = [Engine(model, tok, EngineConfig(device="cpu", kv_memory_bytes=8 << 20, kv_dtype=kv,
                                             spec=SpecConfig(max_drafters=drafters))).num_blocks
             for kv in ("auto", "bfloat16")]
        assert n[1] in (2 * n[0], 2 * n[0] + 1) if drafters == 0 else n[0] * 1.4 < n[1] < n[0] * 2


def test_kv_dtype_is_checked():
    with pytest.raises(ValueError, match="kv_dtype must be auto, float32 or bfloat16"):
        EngineConfig(kv_dtype="int8")
    assert EngineConfig(kv_dtype="bfloat16").torch_kv_dtype() == torch.bfloat16
    assert EngineConfig(device="cpu").torch_kv_dtype() == torch.float32
