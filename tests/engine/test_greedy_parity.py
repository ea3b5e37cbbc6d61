"""Greedy decoding through the engine gives exactly the token ids ``transformers.generate`` gives.

One engine batch of mixed prompt lengths (arithmetic test prompts plus very short and long ones);
then the same batch with 4-token blocks, a small KV cache and a small token budget, so chunked
prefill, preemption and recompute all happen mid-run and must not change a single token.
"""

from __future__ import annotations

import pytest
import torch
from engine_util import drain, make_engine, one_thread

from gambit.engine import FinishedEvent, SamplingParams, TokenEvent
from gambit.tasks.arithmetic import TaskConfig, generate

transformers = pytest.importorskip("transformers")

NEW = 48


def _prompts(tok) -> list[list[int]]:
    prompts = [tok.encode(p.prompt) for p in generate("test", 32, 0, TaskConfig(2, 10))]
    long_text = "".join(p.prompt + p.solution + "\n\n" for p in generate("dev", 12, 1))
    prompts += [
        [tok.bos_id],  # a single token
        tok.encode("7"),
        tok.encode("Compute 1+1.\nSolution:\n1+1=2\n\n"),  # ends in the boundary token
        tok.encode(long_text)[:300],
    ]
    return prompts


@pytest.fixture(scope="module")
def hf_reference(target_folder, target):
    """transformers' greedy continuations, NEW tokens each, EOS not treated as a stop."""
    _, tok = target
    prompts = _prompts(tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # generate exactly NEW tokens, like ignore_eos
    L = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_id] * (L - len(p)) + p for p in prompts])
    mask = (ids != -1).long()
    for i, p in enumerate(prompts):
        mask[i, : L - len(p)] = 0
    with torch.no_grad(), one_thread():
        out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW,
                          pad_token_id=tok.pad_id)
    refs = [out[i, L:].tolist() for i in range(len(prompts))]
    return prompts, refs, hf


def _hf_single(hf, prompt: list[int], pad_id: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, pad_token_id=pad_id)
    return out[0, len(prompt):].tolist()


def _check(outputs, prompts, refs, hf, pad_id):
    assert len(outputs) == len(prompts)
    for i, (ours, ref) in enumerate(zip(outputs, refs, strict=True)):
        assert len(ours) == NEW, i
        if ours != ref:  # left padding may shift transformers' numerics: ask it once more, unpadded
            ref = _hf_single(hf, prompts[i], pad_id)
        assert ours == ref, f"prompt {i} (len {len(prompts[i])}) diverges at " \
                            f"{next(j for j in range(NEW) if ours[j] != ref[j])}"


def test_greedy_matches_transformers_one_batch(target, hf_reference):
    prompts, refs, hf = hf_reference
    eng = make_engine(target)
    ids = [eng.add(p, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)) for p in prompts]
    events = eng.step()  # everything is admitted and prefilled in the first step: one batch
    assert eng.stats.last_batch_size == len(prompts)
    events += drain(eng)
    fin = {e.trace_id: e for e in events if isinstance(e, FinishedEvent)}
    assert set(fin) == set(ids) and all(e.reason == "length" for e in fin.values())
    outputs = [list(fin[i].output_ids) for i in ids]
    # token events carry the same ids in order, at consecutive positions after the prompt
    for tid, p, out in zip(ids, prompts, outputs, strict=True):
        toks = [e for e in events if isinstance(e, TokenEvent) and e.trace_id == tid]
        assert [e.token_id for e in toks] == out
        assert [e.position for e in toks] == list(range(len(p), len(p) + NEW))
    assert eng.stats.max_batch_size == len(prompts)
    assert eng.stats.preemptions == 0 and eng.stats.evictions == 0
    assert len(set(map(tuple, outputs))) > len(prompts) // 2  # not one degenerate continuation
    _check(outputs, prompts, refs, hf, target[1].pad_id)
    assert eng.blocks.num_free == eng.num_blocks and eng.kv_usage() == 0.0


def test_greedy_parity_survives_preemption_and_chunked_prefill(target, hf_reference):
    prompts, refs, hf = hf_reference
    bs = 4
    longest = max(map(len, prompts)) + NEW
    # room for the longest trace plus a little: most of the batch must be preempted at some point
    num_blocks = -(-longest // bs) + 12
    eng = make_engine(target, block_size=bs, num_blocks=num_blocks, max_num_batched_tokens=96,
                      preemption="recompute")
    outputs = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True))
    assert eng.stats.preemptions > 0
    assert eng.stats.evictions == 0
    # recompute re-feeds prompt (and generated) tokens
    assert eng.stats.prompt_tokens > sum(map(len, prompts))
    _check(outputs, prompts, refs, hf, target[1].pad_id)
    assert eng.blocks.num_free == num_blocks and eng.kv_usage() == 0.0
