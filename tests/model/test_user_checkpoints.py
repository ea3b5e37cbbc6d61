"""Checkpoints as users have them, built with ``transformers`` from configs (no hub): sharded with an
index, linear RoPE, bf16, null config fields, byte-level vs template tokenizers, generation_config's EOS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gambit.model import build_char_tokenizer, load_model

transformers = pytest.importorskip("transformers")

TOL = 1e-4
BASE = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0, "tie_word_embeddings": False}


def _hf_folder(folder: Path, vocab_size: int = 100, shard: str | None = None, dtype=torch.float32, **kw):
    """A random-weight Llama saved with ``save_pretrained`` (norm weights away from 1), our tokenizer."""
    config = transformers.LlamaConfig(**{**BASE, "vocab_size": vocab_size, **kw})
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in n else 0.0, 0.1)
    hf = hf.to(dtype).eval()
    hf.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    build_char_tokenizer().save(folder / "tokenizer.json")
    return hf.float()


def _max_diff(model, hf, length: int = 40) -> float:
    ids = torch.randint(3, 100, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return (model.logits(model(ids)[0]) - hf(ids).logits).abs().max().item()


def test_linear_rope_scaling_matches_transformers(tmp_path):
    """It was refused ("rope type 'linear' is not supported") though it is one division."""
    hf = _hf_folder(tmp_path, rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    model, _ = load_model(tmp_path)
    assert model.config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert _max_diff(model, hf) <= TOL


def test_null_rope_scaling_beside_rope_parameters_keeps_the_scaling(tmp_path):
    """A config with both layouts and the legacy key null: llama3 scaling was dropped without a word."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16, "rope_theta": 10000.0}
    hf = _hf_folder(tmp_path, rope_parameters=rope, head_dim=16, hidden_size=64)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "rope_scaling": None, "rope_theta": None}))
    model, _ = load_model(tmp_path)
    assert model.config.rope_scaling["rope_type"] == "llama3" and model.config.rope_theta == 10000.0
    assert _max_diff(model, hf) <= TOL


@pytest.mark.parametrize("key,value,match", [
    ("rms_norm_eps", None, "rms_norm_eps must be a positive number, got None"),  # ran with eps 1.2e-7
    ("rope_theta", "1e6", "rope_theta must be a positive number"),  # a TypeError deep in the rope table
    ("rope_scaling", "llama3", "rope_scaling must be a JSON object"),  # an AttributeError
    ("rope_scaling", {"factor": 4.0}, "names no rope_type"),  # read as no scaling
    ("rope_parameters", {"rope_type": "dynamic", "factor": 2.0}, "'dynamic' is not supported"),
    ("tie_word_embeddings", "no", "tie_word_embeddings must be true or false"),  # "no" read as tied
])
def test_bad_config_fields_are_named(tmp_path, key, value, match):
    _hf_folder(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ValueError, match=str(path) + ".*" + match):
        load_model(tmp_path)


def test_null_bias_flags_read_as_false(tmp_path):
    hf = _hf_folder(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "attention_bias": None, "mlp_bias": None}))
    model, _ = load_model(tmp_path)
    assert model.config.attention_bias is False and _max_diff(model, hf, 8) <= TOL


def test_sharded_checkpoint_reads_the_shards_its_index_names(tmp_path):
    hf = _hf_folder(tmp_path, shard="20KB")
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file()
    # a stray full copy beside the shards (under other names) is not read: the index says what is
    save_file({"layers.0.attention.wq.weight": torch.zeros(2)}, str(tmp_path / "consolidated.safetensors"))
    model, _ = load_model(tmp_path)
    assert _max_diff(model, hf) <= TOL
    shards[1].unlink()
    with pytest.raises(FileNotFoundError, match=str(shards[1]) + ": a shard model.safetensors.index.json"):
        load_model(tmp_path)


def test_a_tensor_in_two_files_is_an_error_naming_it(tmp_path):
    """Without an index every *.safetensors is read; one replaced the other's tensor silently."""
    _hf_folder(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({"model.norm.weight": torch.zeros_like(state["model.norm.weight"])},
              str(tmp_path / "zz-extra.safetensors"))
    with pytest.raises(ValueError, match=r"zz-extra\.safetensors: tensor model\.norm\.weight is also in "
                                         r"model\.safetensors"):
        load_model(tmp_path)


def test_bf16_checkpoint_loads_at_either_dtype(tmp_path):
    _hf_folder(tmp_path, dtype=torch.bfloat16)
    assert next(iter(load_file(str(tmp_path / "model.safetensors")).values())).dtype == torch.bfloat16
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    model, _ = load_model(tmp_path)
    assert _max_diff(model, hf) <= TOL  # fp32 of the bf16 weights, as transformers upcasts them
    low, _ = load_model(tmp_path, dtype="bf16")
    assert all(p.dtype == torch.bfloat16 for p in low.parameters())
    assert torch.equal(low.model.embed_tokens.weight.float(), model.model.embed_tokens.weight)


def test_load_does_not_random_init_the_weights_it_replaces(tmp_path, monkeypatch):
    """A 1B-parameter Llama took 54 s on two cores to initialise randomly before its weights were read."""
    hf = _hf_folder(tmp_path)

    def no_init(self):
        if self.weight.device.type != "meta":  # on meta it allocates and draws nothing
            raise AssertionError("load_model initialised weights randomly")

    monkeypatch.setattr(torch.nn.Linear, "reset_parameters", no_init)
    monkeypatch.setattr(torch.nn.Embedding, "reset_parameters", no_init)
    model, _ = load_model(tmp_path)
    assert all(p.requires_grad and p.device.type == "cpu" for p in model.parameters())  # trainable as before
    assert _max_diff(model, hf, 8) <= TOL


# ---- tokenizers: which BOS transformers adds, and where generation stops -------------------------

def _byte_level(template_bos: bool):
    """A byte-level BPE tokenizer: Qwen2 / SmolLM2 style (ByteLevel post-processor, no BOS) or Llama 3
    style (ByteLevel then a template that puts <|begin_of_text|> first)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=True, normalized=False)
                    for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")])
    bos = tok.token_to_id("<|begin_of_text|>")
    level = processors.ByteLevel(trim_offsets=False)
    tok.post_processor = (processors.Sequence([level, processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
        if template_bos else level)
    return tok, bos


@pytest.mark.parametrize("template_bos", [False, True], ids=["qwen2-style", "llama3-style"])
def test_bos_is_what_transformers_adds(tmp_path, template_bos):
    """config.json names a bos_token_id in both; only the template tokenizer adds it (Qwen2.5's config
    names <|endoftext|>, which was prepended to every prompt)."""
    tok, bos = _byte_level(template_bos)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end_of_text|>",
         "bos_token": "<|begin_of_text|>" if template_bos else None}))
    config = {**BASE, "model_type": "llama", "vocab_size": tok.get_vocab_size(), "bos_token_id": bos}
    (tmp_path / "config.json").write_text(json.dumps(config))
    from gambit.model.loader import load_tokenizer

    ours = load_tokenizer(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert ours.bos_id == (bos if template_bos else None)
    for text in ("Step 1: 2+2=4\n\n", "héllo wörld"):
        assert ours.encode(text) == theirs(text)["input_ids"], text
        assert ours.decode(ours.encode(text)) == text


def test_a_tokenizer_config_saying_add_bos_keeps_the_configs_bos(tmp_path):
    tok, bos = _byte_level(template_bos=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "vocab_size": 300, "bos_token_id": bos}))
    from gambit.model.loader import load_tokenizer

    assert load_tokenizer(tmp_path).encode("a")[0] == bos


def test_generation_config_eos_ids_stop_generation_too(tmp_path):
    """Llama 3 Instruct: config.json names <|end_of_text|>, generation_config.json adds <|eot_id|>."""
    _hf_folder(tmp_path, eos_token_id=2)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, 9]}))
    model, tok = load_model(tmp_path)
    assert tok.eos_ids == [2, 7, 9] and model.config.eos_ids == [2]
    (tmp_path / "generation_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="generation_config.json: malformed JSON"):
        load_model(tmp_path)
