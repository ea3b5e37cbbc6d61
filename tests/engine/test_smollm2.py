"""The engine on a real checkpoint (SmolLM2-135M, byte-level BPE, 30 layers, GQA 9/3): greedy output
equals transformers' on real prompts with and without the chat template, and thought boundaries
are found where "\\n\\n" is one merged token, part of a longer token, or two "\\n" tokens."""

from __future__ import annotations

import pytest
import torch
from engine_util import closes_thought, drain

from gambit.engine import BoundaryEvent, Engine, EngineConfig, FinishedEvent, SamplingParams, TokenEvent
from gambit.model import load_model

NEW = 24
PLAIN = ["The capital of France is", "1. Apples\n\n2. Pears\n\n3."]
CHATS = [[{"role": "user", "content": "List three steps to make tea."}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 7*6?"}]]


@pytest.fixture(scope="module")
def real(smollm2_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(smollm2_folder)
    model, tok = load_model(smollm2_folder)
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", block_size=16, num_blocks=64))
    return eng, hf, hf_tok


def test_greedy_equals_transformers_with_and_without_chat_template(real):
    eng, hf, hf_tok = real
    chats = [hf_tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in CHATS]
    prompts = [eng.tokenizer.encode(p) for p in PLAIN + chats]
    assert all(p.count(1) == 0 for p in prompts[:2]) and all(p[0] == 1 for p in prompts[2:])
    outs = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    for ids, out in zip(prompts, outs, strict=True):
        x = torch.tensor([ids])
        with torch.inference_mode():  # eos_token_id=None: transformers never stops early either
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=2)[0, len(ids):].tolist()
        assert out == ref, eng.tokenizer.decode(ids)
    # the chat answers really are chat answers: they end their turn
    assert any(2 in out for out in outs[2:])


def test_batch_one_streams_and_equals_transformers(real):
    """One trace: every product is one row, so the large weights stream through cpu_gemv and the norms
    run in one kernel call (other floats than transformers' in the last bits); greedy output is equal."""
    eng, hf, hf_tok = real
    assert eng.model.model.layers[0].mlp.fast["gate_up"].stream is not None
    chat = hf_tok.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True)
    for text in (PLAIN[0], chat):
        ids = eng.tokenizer.encode(text)
        out = eng.generate([ids], SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))[0]
        x = torch.tensor([ids])
        with torch.inference_mode():
            ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=2)[0, len(ids):].tolist()
        assert out == ref, text


def test_boundaries_with_a_bpe_vocabulary(real):
    eng, _, _ = real
    tok = eng.tokenizer
    # the vocabulary has "\n\n" alone (1116), inside longer tokens, and "\n" (198) that pairs up
    assert 1116 in tok.boundary_ids and len(tok.boundary_ids) > 1 and 198 not in tok.boundary_ids
    assert 198 in tok.newline_end_ids and 198 in tok.newline_start_ids and 1116 not in tok.newline_end_ids
    prompts = ["The capital of France is", "1. Apples\n\n2. Pears\n\n3.",
               "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"]
    ids = [eng.add(p, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)) for p in prompts]
    events = drain(eng)
    fin = {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}
    model = eng.model
    kinds = set()
    for tid, text in zip(ids, prompts, strict=True):
        prompt = tok.encode(text)
        full = prompt + list(fin[tid].output_ids)
        got = [e for e in events if isinstance(e, BoundaryEvent) and e.trace_id == tid]
        want = [p for p in range(len(prompt), len(full) - 1) if closes_thought(tok, full, p)]
        assert [e.position for e in got] == want, tok.decode(full)
        kinds |= {"merged" if full[p] in tok.boundary_ids else "pair" for p in want}
        with torch.inference_mode():
            hidden = model(torch.tensor([full]))[0][0]
        for e in got:
            assert torch.allclose(e.hidden, hidden[e.position], atol=1e-3)
    assert kinds == {"merged", "pair"}  # both kinds of boundary were generated and found


def test_cpp_layer_loop_is_bit_identical_on_the_real_model(real):
    """30 layers, GQA 9/3: the C++ layer loop (cpu_decoder) gives the Python loop's exact floats."""
    eng, _, _ = real
    runs = []
    for on in (False, True):
        eng.runner.cpp_layers = on
        ids = [eng.add(p, SamplingParams(temperature=0.8, max_tokens=8, seed=3, logprobs=2, ignore_eos=True))
               for p in PLAIN]
        runs.append([(e.trace_id - ids[0], e.token_id, e.logprob, e.top_logprobs)
                     for e in drain(eng) if isinstance(e, TokenEvent)])
    eng.runner.cpp_layers = True
    assert len(runs[0]) == 2 * 8 and runs[1] == runs[0]
