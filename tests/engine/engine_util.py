"""Helpers shared by the engine tests (imported as ``engine_util``; tests/engine is on sys.path)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

import gambit
from gambit.engine import Engine, EngineConfig
from gambit.model import CausalLM, ModelConfig, build_char_tokenizer, save_model
from gambit.train.target import TrainTargetConfig, model_config

SHIPPED = Path(gambit.__file__).parent / "assets" / "target"


@contextmanager
def one_thread():
    """Run torch on one intra-op thread (tiny models; the CPUs may be shared with training)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def randomize(model: CausalLM, seed: int, std: float = 0.2) -> CausalLM:
    """Re-initialise every matrix ``normal(0, std)``; norm weights ``1 + normal(0, std / 2)``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2:
                p.copy_(noise * std)
            else:
                p.copy_(1.0 + noise * std / 2)
    return model.eval()


def build_standin(folder: Path, seed: int = 1234) -> Path:
    tok = build_char_tokenizer()
    model = randomize(CausalLM(model_config(TrainTargetConfig(), tok)), seed)
    save_model(model, tok, folder)
    return folder


def tiny_model(seed: int = 0, layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2,
               max_positions: int = 256) -> tuple[CausalLM, object]:
    """A small random CausalLM over the char tokenizer (fast steps for property tests)."""
    tok = build_char_tokenizer()
    cfg = ModelConfig(vocab_size=tok.vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      bos_token_id=tok.bos_id, eos_token_id=tok.eos_ids[0], pad_token_id=tok.pad_id)
    torch.manual_seed(seed)
    return randomize(CausalLM(cfg), seed, std=0.3), tok


def make_engine(model_tok, **cfg) -> Engine:
    model, tok = model_tok
    cfg.setdefault("device", "cpu")
    cfg.setdefault("dtype", "float32")
    return Engine(model, tok, EngineConfig(**cfg))


def drain(engine: Engine, max_steps: int = 10_000) -> list:
    """Step until nothing is left; all events in order."""
    events = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return events
        events.extend(engine.step())
    raise AssertionError(f"engine still busy after {max_steps} steps")


def slot_major(t: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """A KV cache tensor as ``[layers, slots, kv_heads, head_dim]`` whatever its block layout.

    The cache keeps ``num_blocks`` and ``block_size`` as adjacent axes (where the heads go is an
    implementation choice); slot ``b * block_size + i`` is token ``i`` of block ``b``.
    """
    ax = next(i for i in range(1, t.dim() - 1) if t.shape[i] == num_blocks and t.shape[i + 1] == block_size)
    t = t.flatten(ax, ax + 1)  # [L, ..., slots, ..., D]
    return t.movedim(ax, 1)


def closes_thought(tok, ids: list[int], p: int) -> bool:
    """Reference rule from texts: token p has "\\n\\n", or a lone trailing "\\n" meets a leading one."""
    text = tok.decode([ids[p]], skip_special=False)
    before = tok.decode([ids[p - 1]], skip_special=False) if p else ""
    return "\n\n" in text or (before.endswith("\n") and not before.endswith("\n\n")
                                and text.startswith("\n"))


def tied_row(V: int = 100) -> torch.Tensor:
    """A row [V]: four clear leaders, then ids 29 and 84 tied for fifth (ATen's topk(5) lists 84, topk(20)
    29): a row's top n must not depend on the k a batch asks for."""
    g = torch.Generator().manual_seed(0)
    row = torch.linspace(-5, 0, V)[torch.randperm(V, generator=g)]
    for i, v in zip((7, 8, 9, 10), (6.0, 5.5, 5.0, 4.5), strict=True):
        row[i] = v
    row[29] = row[84] = 3.0
    return row
