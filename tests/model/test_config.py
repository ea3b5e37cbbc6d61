"""ModelConfig: both Hugging Face rope layouts, to_hf_dict round-trip, validation."""

from __future__ import annotations

import dataclasses

import pytest

from gambit.model.config import ModelConfig

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def _fields(c: ModelConfig) -> dict:
    """All dataclass fields but ``extra`` (to_hf_dict adds architectures/hidden_act there)."""
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name != "extra"}


@pytest.mark.parametrize("old_key", ["rope_type", "type"])
def test_llama3_rope_layouts_agree(old_key):
    new = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3",
                                                             **LLAMA3}})
    old = ModelConfig.from_dict({**BASE, "rope_theta": 500000.0,
                                 "rope_scaling": {old_key: "llama3", **LLAMA3}})
    assert new == old
    assert new.rope_theta == 500000.0
    assert new.rope_scaling == {"rope_type": "llama3", **LLAMA3}
    assert "rope_parameters" not in new.extra


def test_rope_parameters_with_legacy_type_key():
    c = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 1e6, "type": "llama3", **LLAMA3}})
    assert c.rope_scaling is not None and c.rope_scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("old", [{"rope_theta": 1e6}, {"rope_theta": 1e6, "rope_scaling": None},
                                 {"rope_theta": 1e6, "rope_scaling": {"rope_type": "default"}},
                                 {"rope_theta": 1e6, "rope_scaling": {"type": "default"}}])
def test_default_rope_layouts_agree(old):
    new = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}})
    assert new == ModelConfig.from_dict({**BASE, **old})
    assert new.rope_scaling is None and new.rope_theta == 1e6


def test_missing_rope_keys_use_defaults():
    c = ModelConfig.from_dict(BASE)
    assert c.rope_theta == 10000.0 and c.rope_scaling is None
    assert c.head_dim == 16 and c.num_key_value_heads == 2


ROUND_TRIP = [
    ModelConfig(**BASE),
    ModelConfig(**BASE, rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **LLAMA3},
                tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                bos_token_id=1, eos_token_id=[2, 5], pad_token_id=0),
    ModelConfig(**BASE, rope_scaling={"type": "llama3", **LLAMA3}),  # legacy key keeps its scaling
    ModelConfig(**{**BASE, "num_key_value_heads": None}, model_type="qwen2", eos_token_id=2,
                extra={"sliding_window": None, "use_sliding_window": False}),
    ModelConfig(**BASE, model_type="qwen3", head_dim=32, rms_norm_eps=1e-5, rope_theta=1e6),
]


@pytest.mark.parametrize("config", ROUND_TRIP, ids=lambda c: c.model_type)
def test_to_hf_dict_round_trip(config):
    d = config.to_hf_dict()
    assert d["rope_parameters"]["rope_theta"] == config.rope_theta
    assert "rope_scaling" not in d and "rope_theta" not in d
    want = "llama3" if config.rope_scaling else "default"
    assert d["rope_parameters"]["rope_type"] == want
    assert d["architectures"] == [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                   "qwen3": "Qwen3ForCausalLM"}[config.model_type]]
    back = ModelConfig.from_dict(d)
    assert _fields(back) == _fields(config)
    assert config.extra.items() <= back.extra.items()
    assert ModelConfig.from_dict(back.to_hf_dict()) == back  # stable from the second trip on
    assert back.to_hf_dict() == d


def test_unknown_keys_kept_in_extra_and_written_back():
    c = ModelConfig.from_dict({**BASE, "initializer_range": 0.02, "custom": {"a": 1}})
    assert c.extra == {"initializer_range": 0.02, "custom": {"a": 1}}
    assert c.to_hf_dict()["custom"] == {"a": 1}


@pytest.mark.parametrize("family,qkv,o,qk_norm", [
    ("llama", False, False, False), ("qwen2", True, False, False), ("qwen3", False, False, True)])
def test_family_properties(family, qkv, o, qk_norm):
    c = ModelConfig(**BASE, model_type=family)
    assert (c.qkv_bias, c.o_bias, c.qk_norm) == (qkv, o, qk_norm)


@pytest.mark.parametrize("family,qkv,o", [("llama", True, True), ("qwen2", True, False),
                                          ("qwen3", True, True)])
def test_attention_bias_per_family(family, qkv, o):
    """As transformers: Llama and Qwen3 bias q/k/v/o; Qwen2 biases q/k/v only."""
    c = ModelConfig(**BASE, model_type=family, attention_bias=True)
    assert (c.qkv_bias, c.o_bias) == (qkv, o)


@pytest.mark.parametrize("eos,ids", [(None, []), (2, [2]), ([2, 7], [2, 7])])
def test_eos_ids(eos, ids):
    assert ModelConfig(**BASE, eos_token_id=eos).eos_ids == ids


@pytest.mark.parametrize("change,match", [
    ({"model_type": "mistral"}, "model_type"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"num_attention_heads": 0, "num_key_value_heads": None}, "num_attention_heads"),
    ({"num_attention_heads": -4}, "num_attention_heads"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"vocab_size": 1.5}, "vocab_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"hidden_size": 66}, "divisible"),
    ({"head_dim": 0}, "head_dim"),
    ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"type": "dynamic", "factor": 4.0}}, "dynamic"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "llama3"),
])
def test_validation_errors(change, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict({**BASE, **change})


def test_explicit_head_dim_need_not_divide_hidden():
    c = ModelConfig.from_dict({**BASE, "hidden_size": 66, "head_dim": 16, "model_type": "qwen3"})
    assert c.head_dim == 16


def test_missing_required_field_is_type_error():
    d = dict(BASE)
    del d["vocab_size"]
    with pytest.raises(TypeError):
        ModelConfig.from_dict(d)
