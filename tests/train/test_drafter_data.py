"""Drafter data for a real checkpoint: questions through the chat template, a reduced draft vocabulary
(the most used target ids, logits recorded over them only), and a drafter built on it."""

from __future__ import annotations

import json

import pytest
import torch

from gambit.model import load_model
from gambit.paths import TARGET
from gambit.train.drafter import TrainDrafterConfig, build_drafter, train_drafter
from gambit.train.drafter_data import DrafterDataConfig, _record, build_data, chat_prompts, most_used

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_most_used_ranks_by_count_then_lower_id_ascending():
    outs = [[5, 5, 5, 2, 9], [9, 9, 7, 2]]  # counts: 9→3, 5→3, 2→2, 7→1
    assert most_used(outs, 12, 2).tolist() == [5, 9]
    assert most_used(outs, 12, 3).tolist() == [2, 5, 9]
    assert most_used([[1]], 4, 3).tolist() == [0, 1, 2]  # unused ids fill by lower id
    assert most_used([[1]], 4, 10).tolist() == [0, 1, 2, 3]


def test_chat_prompts_render_the_models_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    want = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert chat_prompts(str(tmp_path), ["2+2?"]) == [want]
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert chat_prompts(str(tmp_path), ["2+2?"]) == ["2+2?"]
    assert chat_prompts(str(tmp_path / "none"), ["q"]) == ["q"]


def test_config_checks_and_keys(tmp_path):
    with pytest.raises(ValueError, match="draft_vocab"):
        DrafterDataConfig(draft_vocab=-1)
    with pytest.raises(ValueError, match="prompts file not found"):
        DrafterDataConfig(prompts=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="--out"):
        TrainDrafterConfig(target=str(tmp_path))
    f = tmp_path / "q.jsonl"
    f.write_text('{"question": "a?", "answer": "#### 1"}\n')
    base = DrafterDataConfig()
    # the arithmetic data keeps the key it had before the real-model fields (its cache stays valid)
    assert base.key() == DrafterDataConfig(prompts="", draft_vocab=0).key()
    keys = {base.key(), DrafterDataConfig(draft_vocab=50).key(), DrafterDataConfig(prompts=str(f)).key()}
    assert len(keys) == 3
    # data written under pinned kernels has its own key; the machine's keeps the key it had before
    assert base.key() == DrafterDataConfig(isa="machine").key() != DrafterDataConfig(isa="compatible").key()
    assert TrainDrafterConfig(isa="compatible").data().isa == "compatible"
    for cls in (DrafterDataConfig, TrainDrafterConfig):
        with pytest.raises(ValueError, match="isa must be one of machine, compatible"):
            cls(isa="avx9")


def test_pinned_data_is_written_only_in_a_pinned_process(tmp_path):
    """pytest runs the machine's kernels: compatible data here would carry the wrong floats."""
    with pytest.raises(RuntimeError, match="pinned to it"):
        build_data(DrafterDataConfig(isa="compatible", cache_dir=str(tmp_path)), (1, 3, 5))
    with pytest.raises(ValueError, match="cannot cross"):
        train_drafter(TrainDrafterConfig(isa="compatible"), stop=1, data={})


def test_reduced_vocabulary_logits_and_drafter_map():
    model, tok = load_model(TARGET)
    prompts, outs = ["Compute 2+3.\n", "Compute 4*5.\n"], [[10, 11, 12, 10], [13, 10, 14]]
    draft_ids = most_used(outs, model.config.vocab_size, 8)
    taps = (1, 3, 4)
    full = _record(model, tok, prompts, outs, taps, "full")
    red = _record(model, tok, prompts, outs, taps, "reduced", draft_ids=draft_ids)
    assert red.logits.dtype == torch.float16 and red.logits.shape == (full.logits.shape[0], 8)
    torch.testing.assert_close(red.logits.float(), full.logits[:, draft_ids], atol=2e-2, rtol=2e-3)
    assert torch.equal(red.taps, full.taps) and torch.equal(red.draft_ids, draft_ids)
    batch = red.batch([0, 1], tok.pad_id)
    assert batch["logits"].dtype == torch.float32 and batch["logits"].shape[-1] == 8
    d = build_drafter(TrainDrafterConfig(method="pr"), model, draft_ids)
    assert d.config.draft_vocab_size == 8
    assert torch.equal(d.to_target(torch.arange(8)), draft_ids)
    assert d.t2d.sum() == 8 and bool(d.t2d[draft_ids].all())
    torch.testing.assert_close(d.lm_head.weight, model.lm_head_weight()[draft_ids])
