"""The CPU kernel's row metadata (``PagedAttention._kernel_rows``) the same whichever way its slots are
built: a Python list for a few tree rows, tensor ops past ``SLOTS_LIST_MAX_TOKENS`` rows (a drafter's
context pass)."""

from __future__ import annotations

import torch

from gambit.engine import attention
from gambit.engine.attention import PagedAttention, SeqInput
from gambit.engine.kv_cache import KVCache
from gambit.model import ModelConfig

BS = 4
CFG = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1)


def _items() -> list[SeqInput]:
    """Ragged rows over scattered block tables: a long causal span, a short one, a tree of 3 nodes."""
    g = torch.Generator().manual_seed(0)
    tables = [torch.randperm(400, generator=g)[:n].tolist() for n in (120, 20, 12)]
    spans = [(5, 450), (17, 40), (30, 3)]  # (ctx, q)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    return [SeqInput([1] * q, list(range(c, c + q)), c, t, tree if q == 3 else None)
            for (c, q), t in zip(spans, tables, strict=True)]


def _meta(monkeypatch, cut: int) -> PagedAttention:
    monkeypatch.setattr(attention, "SLOTS_LIST_MAX_TOKENS", cut)
    cache = KVCache(CFG, 400, BS, torch.float32, torch.device("cpu"))
    return PagedAttention(cache, _items(), torch.device("cpu"), use_kernel=True, speculative=True)


def test_tensor_built_slots_equal_the_per_token_list(monkeypatch):
    items = _items()
    want = [t.block_table[p // BS] * BS + p % BS for t in items for p in range(t.ctx, t.ctx + t.q)]
    by_list, by_tensor = _meta(monkeypatch, 10 ** 9), _meta(monkeypatch, 0)
    assert by_list.slots.tolist() == want and by_tensor.slots.tolist() == want
    assert by_tensor.num_tokens == by_list.num_tokens == len(want)
    for a, b in zip(by_list.multi, by_tensor.multi, strict=True):
        assert torch.equal(a, b)
