"""``KVCache.copy_blocks``: a fork's partial block copies only its cached slots, bit for bit, on
the compiled path (``kv_copy_slots``), the numpy path and the torch path alike, for float and
half-width dtypes."""

from __future__ import annotations

import pytest
import torch

from gambit.engine.kv_cache import KVCache
from gambit.model.config import ModelConfig


def _cache(dtype: torch.dtype) -> KVCache:
    cfg = ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    cache = KVCache(cfg, num_blocks=6, block_size=4, dtype=dtype, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["kernel", "numpy", "torch"])
def test_copy_blocks_copies_only_the_cached_slots(dtype, path):
    cache = _cache(dtype)
    if path == "kernel":
        from gambit.engine import cpu_attention

        cache.kernel = cpu_attention.kernel()
        if cache.kernel is None:
            pytest.skip("the CPU kernels do not build here")
    if path == "torch":
        cache._bits = ()  # as off the CPU: torch views
    k0, v0 = cache.k.clone(), cache.v.clone()
    cache.copy_blocks([(1, 4), (2, 5)], slots=3)
    for before, after in ((k0, cache.k), (v0, cache.v)):
        assert torch.equal(after[:, :, 4, :3], before[:, :, 1, :3])
        assert torch.equal(after[:, :, 5, :3], before[:, :, 2, :3])
        assert torch.equal(after[:, :, 4:, 3:], before[:, :, 4:, 3:])  # the rest of the block untouched
        assert torch.equal(after[:, :, :4], before[:, :, :4])  # sources and other blocks untouched
    cache.copy_blocks([(0, 3)])  # no slots: the whole block
    assert torch.equal(cache.k[:, :, 3], k0[:, :, 0]) and torch.equal(cache.v[:, :, 3], v0[:, :, 0])


def test_copy_blocks_refuses_slots_outside_a_block():
    cache = _cache(torch.float32)
    for bad in (0, 5, -1):
        with pytest.raises(ValueError, match="slots"):
            cache.copy_blocks([(0, 1)], slots=bad)


def test_the_kernel_refuses_blocks_outside_the_cache():
    from gambit.engine import cpu_attention

    kernel = cpu_attention.kernel()
    if kernel is None:
        pytest.skip("the CPU kernels do not build here")
    cache = _cache(torch.float32)
    for src, dst in ((0, 6), (-1, 2), (3, 3)):
        with pytest.raises(RuntimeError, match="bad blocks"):
            kernel.kv_copy_slots(cache.k, cache.v, src, dst, 2)
    with pytest.raises(RuntimeError, match="contiguous"):
        kernel.kv_copy_slots(cache.k.transpose(0, 1), cache.v, 0, 1, 2)


def test_sampling_params_child_equals_replace_and_checks_what_it_changes():
    import dataclasses

    from gambit.engine.sequence import SamplingParams

    p = SamplingParams(temperature=0.8, top_k=5, seed=3, logprobs=1, stop=("x",))
    c = p.child(7, 1.2)
    assert c == dataclasses.replace(p, seed=7, temperature=1.2) and c is not p and p.seed == 3
    assert p.child(None, 0.0).seed is None
    for seed, temp in ((-1, 1.0), (1.5, 1.0), ("1", 1.0), (1, float("nan")), (1, -0.1), (1, "hot")):
        with pytest.raises(ValueError):
            p.child(seed, temp)
