"""``EngineConfig.batch_invariant`` on the real checkpoint (SmolLM2-135M), bfloat16 weights and KV: a draft
tree's rows give exactly the logits plain decoding gives the same tokens one step at a time, and a batch
of rows exactly each row's alone, where the default engine's multi-row products round otherwise."""

from __future__ import annotations

import pytest
import torch
from test_attention import _tree_mask

from gambit.engine import Engine, EngineConfig, cpu_attention
from gambit.engine.attention import SeqInput
from gambit.engine.linear import bf16_gemm_available
from gambit.model import load_model

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")

STEPS = 6


def _engine(folder, invariant: bool) -> Engine:
    model, tok = load_model(folder)
    return Engine(model, tok, EngineConfig(device="cpu", dtype="float32", block_size=16, num_blocks=32,
                                           cpu_weights="bfloat16", kv_dtype="bfloat16",
                                           batch_invariant=invariant))


def _plain_then_tree(eng: Engine, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain greedy decoding of STEPS tokens (one row a step; its logits) and, over a fresh copy of the
    prompt's cache, one forward of a tree holding those tokens as a chain with an off-path sibling after
    each (the chain rows' logits)."""
    run, n = eng.runner, len(prompt)
    first = run.forward([SeqInput(prompt, list(range(n)), 0, list(range(8)))], [n - 1]).logits
    tokens, plain = [int(first[0].argmax())], []
    for i in range(STEPS):
        out = run.forward([SeqInput([tokens[-1]], [n + i], n + i, list(range(8)))], [0]).logits
        plain.append(out[0])
        tokens.append(int(out[0].argmax()))
    run.forward([SeqInput(prompt, list(range(n)), 0, list(range(8, 16)))], [n - 1])
    chain = tokens[:STEPS]
    tree, pos, parent = [], [], []  # chain node i at 2i, a sibling (another token, same depth) at 2i + 1
    for i, t in enumerate(chain):
        tree += [t, (t + 17) % eng.model.config.vocab_size]
        pos += [n + i, n + i]
        parent += [2 * i - 2, 2 * i - 2] if i else [-1, -1]
    mask = _tree_mask(parent)
    rows = [2 * i for i in range(STEPS)]
    out = run.forward([SeqInput(tree, pos, n, list(range(8, 16)), mask)], rows).logits
    return torch.stack(plain), out


def test_tree_rows_are_plain_decoding_only_when_invariant(smollm2_folder):
    eng = _engine(smollm2_folder, True)
    prompt = eng.tokenizer.encode("The three primary colours are")
    plain, tree = _plain_then_tree(eng, prompt)
    assert torch.equal(plain, tree)
    # a batch: each row's logits those of the row alone
    prompts = [prompt, eng.tokenizer.encode("12 * 7 ="), eng.tokenizer.encode("Once upon a time")]
    items = [SeqInput(p, list(range(len(p))), 0, list(range(8 * i, 8 * i + 8)))
             for i, p in enumerate(prompts)]
    ends = list(torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1)
    together = eng.runner.forward(items, [int(e) for e in ends]).logits
    for i, it in enumerate(items):
        assert torch.equal(eng.runner.forward([it], [it.q - 1]).logits[0], together[i]), i
    if not bf16_gemm_available():  # the default engine's bf16 weights need oneDNN's bf16 GEMM (AVX2-only)
        return
    default = _engine(smollm2_folder, False)  # the default engine's multi-row products round otherwise
    plain, tree = _plain_then_tree(default, prompt)
    assert not torch.equal(plain, tree)
    torch.testing.assert_close(plain, tree, rtol=0.05, atol=0.5)
