"""Our ``CausalLM`` against ``transformers`` on the same weights (fp32, max abs diff <= 1e-4).

Each case builds a small random config of one family with ``transformers``' own config class,
saves it with ``save_pretrained`` next to our tokenizer, loads it with ``gambit.model.load_model``
and compares logits and hidden-state taps. Weights are drawn with std 0.1 (norm weights around 1)
so that a wrong bias, norm or RoPE detail shows up as a visible difference.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import gambit
from gambit.model import CausalLM, build_char_tokenizer, load_model, save_model
from gambit.tasks.arithmetic import generate
from gambit.train.target import TrainTargetConfig, model_config

transformers = pytest.importorskip("transformers")

TOL = 1e-4
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
SHIPPED = Path(gambit.__file__).parent / "assets" / "target"


def _dims(seed: int, head_dim: int | None = None) -> dict:
    """Small random dimensions; head_dim 16 so llama3 scaling hits all three frequency bands."""
    rng = random.Random(seed)
    n_kv = rng.choice([1, 2])
    heads = n_kv * rng.choice([1, 2])
    hd = 16
    return {"hidden_size": heads * hd if head_dim is None else rng.choice([24, 40]),
            "intermediate_size": rng.choice([40, 56, 72]), "num_hidden_layers": rng.choice([3, 4]),
            "num_attention_heads": heads, "num_key_value_heads": n_kv,
            "rms_norm_eps": rng.choice([1e-5, 1e-6]), "rope_theta": rng.choice([10000.0, 500000.0])}


def _gqa(d: dict) -> dict:
    """Force grouped-query attention: num_key_value_heads < num_attention_heads."""
    return {**d, "num_attention_heads": 4, "num_key_value_heads": 2,
            "hidden_size": 64 if "head_dim" not in d else d["hidden_size"]}


# (id, transformers config class name, kwargs)
CASES = [
    ("llama-gqa-untied", "LlamaConfig", {**_gqa(_dims(0)), "tie_word_embeddings": False}),
    ("llama-tied", "LlamaConfig", {**_dims(1), "tie_word_embeddings": True}),
    ("llama3-rope-tied", "LlamaConfig", {**_gqa(_dims(2)), "rope_scaling": LLAMA3_ROPE,
                                         "max_position_embeddings": 128, "tie_word_embeddings": True}),
    ("llama3-rope-untied", "LlamaConfig", {**_dims(3), "rope_scaling": LLAMA3_ROPE,
                                           "max_position_embeddings": 128, "tie_word_embeddings": False}),
    ("llama-attention-bias", "LlamaConfig", {**_gqa(_dims(4)), "attention_bias": True,
                                             "tie_word_embeddings": False}),
    ("llama-mlp-bias-tied", "LlamaConfig", {**_dims(5), "attention_bias": True, "mlp_bias": True,
                                            "tie_word_embeddings": True}),
    ("qwen2-gqa-untied", "Qwen2Config", {**_gqa(_dims(6)), "tie_word_embeddings": False}),
    ("qwen2-tied", "Qwen2Config", {**_dims(7), "tie_word_embeddings": True}),
    ("qwen3-head-dim", "Qwen3Config", {**_gqa({**_dims(8, head_dim=16), "head_dim": 16}),
                                       "tie_word_embeddings": False}),
    ("qwen3-head-dim-tied", "Qwen3Config", {**_dims(9, head_dim=16), "head_dim": 16,
                                            "tie_word_embeddings": True}),
    ("qwen3-attention-bias", "Qwen3Config", {**_gqa({**_dims(10, head_dim=16), "head_dim": 16}),
                                             "attention_bias": True, "tie_word_embeddings": False}),
]


def _hf_config(cls_name: str, kwargs: dict, vocab_size: int):
    kwargs = dict(kwargs)
    theta = kwargs.pop("rope_theta")
    if "rope_scaling" in kwargs:
        kwargs["rope_scaling"] = {**kwargs["rope_scaling"], "rope_theta": theta}
    else:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    kwargs.setdefault("max_position_embeddings", 64)
    return getattr(transformers, cls_name)(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                                           pad_token_id=0, **kwargs)


def _build_hf_folder(cls_name: str, kwargs: dict, folder: Path, seed: int = 0):
    """Random-weight transformers model saved to ``folder`` with our tokenizer; returns the model."""
    tok = build_char_tokenizer()
    config = _hf_config(cls_name, kwargs, tok.vocab_size)
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in n else 0.0, 0.1)  # norm weights near 1 but not equal to it
    hf = hf.float().eval()
    hf.save_pretrained(folder)
    tok.save(folder / "tokenizer.json")
    return hf


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_logits_and_taps_match_transformers(case, tmp_path):
    name, cls_name, kwargs = case
    hf = _build_hf_folder(cls_name, kwargs, tmp_path)
    model, tok = load_model(tmp_path)
    cfg = model.config
    L = cfg.num_hidden_layers

    # the config we loaded is the one transformers wrote
    saved = json.loads((tmp_path / "config.json").read_text())
    assert cfg.model_type == saved["model_type"]
    assert cfg.tie_word_embeddings == kwargs["tie_word_embeddings"]
    assert cfg.num_attention_heads == kwargs["num_attention_heads"]
    assert cfg.num_key_value_heads == kwargs["num_key_value_heads"]
    assert cfg.rope_theta == kwargs["rope_theta"]
    if "head_dim" in kwargs:
        assert cfg.head_dim == kwargs["head_dim"] != cfg.hidden_size // cfg.num_attention_heads
    if "rope_scaling" in kwargs:
        assert saved["rope_parameters"]["rope_type"] == "llama3"
        assert saved["rope_parameters"]["factor"] == 8.0
        assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3"
        assert cfg.rope_scaling["original_max_position_embeddings"] == 32
        assert cfg.rope_scaling["factor"] == 8.0
    else:
        assert cfg.rope_scaling is None
    assert tok.bos_id == 1 and tok.eos_ids == [2]

    # sequences longer than original_max_position_embeddings=32 so llama3 scaling matters
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, tok.vocab_size, (2, 40), generator=g)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        hidden, taps = model(ids, taps=(0, 2, L))
        logits = model.logits(hidden)
    assert out.logits.abs().max() > 0.1  # weights are not trivially small
    assert (logits - out.logits).abs().max().item() <= TOL, name
    assert set(taps) == {0, 2, L}
    assert len(out.hidden_states) == L + 1
    for i in (0, 2):  # the state entering decoder layer i
        assert (taps[i] - out.hidden_states[i]).abs().max().item() <= TOL, (name, i)
    assert (taps[L] - out.hidden_states[L]).abs().max().item() <= TOL
    assert torch.equal(taps[L], hidden)  # tap L is the post-final-norm output


def test_taps_are_distinct_layers(tmp_path):
    """Tap indices select different states, not one state repeated."""
    _build_hf_folder("LlamaConfig", {**_dims(0), "tie_word_embeddings": False}, tmp_path)
    model, _ = load_model(tmp_path)
    L = model.config.num_hidden_layers
    with torch.no_grad():
        _, taps = model(torch.randint(3, 100, (1, 8)), taps=tuple(range(L + 1)))
    assert sorted(taps) == list(range(L + 1))
    for i in range(L):
        assert not torch.allclose(taps[i], taps[i + 1])


# ---- the shipped target model -------------------------------------------------------------------

def compare_folder_with_transformers(folder: Path, n_prompts: int = 4) -> None:
    """Our loader vs ``transformers`` on a model folder: logits on real prompts and tokenizer ids."""
    model, tok = load_model(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf_tok.bos_token_id == tok.bos_id
    assert hf_tok.eos_token_id == tok.eos_ids[0]
    assert hf_tok.pad_token_id == tok.pad_id
    for p in generate("test", n_prompts, 0):
        for text in (p.prompt, p.prompt + p.solution):
            ours_ids = tok.encode(text, add_bos=False)
            assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours_ids, text
            assert hf_tok.decode(ours_ids) == tok.decode(ours_ids) == text
        ids = torch.tensor([tok.encode(p.prompt + p.solution)])
        with torch.no_grad():
            ours = model.logits(model(ids)[0])
            theirs = hf(ids).logits
        assert ours.shape == theirs.shape == (1, ids.shape[1], tok.vocab_size)
        assert (ours - theirs).abs().max().item() <= TOL, p.expr


def test_standin_target_folder_matches_transformers(tmp_path):
    """The shipped-model path, exercised on an untrained model of the shipped architecture."""
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = CausalLM(model_config(TrainTargetConfig(), tok))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norm weights away from 1 too
    folder = tmp_path / "target"
    save_model(model, tok, folder)
    compare_folder_with_transformers(folder, n_prompts=2)


@pytest.mark.skipif(not SHIPPED.exists(), reason=f"{SHIPPED} not trained yet (gambit train target)")
def test_shipped_target_matches_transformers():
    compare_folder_with_transformers(SHIPPED)
