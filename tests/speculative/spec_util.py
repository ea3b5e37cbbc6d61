"""Helpers shared by the speculative tests (imported as ``spec_util``; tests/speculative is on sys.path)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

import gambit
from gambit.model import CausalLM, ModelConfig, build_char_tokenizer

SHIPPED = Path(gambit.__file__).parent / "assets" / "target"


@contextmanager
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def randomize(model: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise * std if p.dim() >= 2 else 1.0 + noise * std / 2)
    return model.eval()


def tiny_target(seed: int = 0, layers: int = 6, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
                max_positions: int = 512, vocab: int | None = None):
    """(model, tokenizer): a small random target over the char tokenizer (or a smaller vocabulary)."""
    tok = build_char_tokenizer()
    cfg = ModelConfig(vocab_size=vocab or tok.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_ids[0], pad_token_id=tok.pad_id)
    return randomize(CausalLM(cfg), seed), tok
