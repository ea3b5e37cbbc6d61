"""The in-place CPU decode kernel against PyTorch SDPA over gathered blocks, and in the engine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.cpu_attention import kernel, paged_decode

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
                                       (9, 3, 64, 16)])  # SmolLM2: GQA 9/3, head_dim 64
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
