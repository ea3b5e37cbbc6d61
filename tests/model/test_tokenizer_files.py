"""The tokenizer files a saved checkpoint carries, read back by us and by transformers: the same BOS,
the tokenizer's own special tokens, and the pad id transformers reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit.model import CausalLM, ModelConfig, Tokenizer, build_char_tokenizer, load_model, save_model
from gambit.model.loader import load_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = ("12+30=42\n\nso 42.", "a b")


def _config(tok: Tokenizer, **kw) -> ModelConfig:
    return ModelConfig(**{"vocab_size": tok.vocab_size, "hidden_size": 16, "intermediate_size": 24,
                          "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 96,
                          "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_ids[0], **kw})


def _byte_level(extra=("<|endoftext|>", "<|im_start|>", "<|im_end|>")) -> Tokenizer:
    """A byte-level BPE tokenizer (SmolLM2 / Qwen2 style: no BOS, no ``<pad>`` token)."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in extra])
    return Tokenizer(tok, None, [tok.token_to_id("<|im_end|>")], tok.token_to_id("<|im_end|>"))


def test_a_saved_checkpoint_gets_the_bos_in_transformers_too(tmp_path):
    """tokenizer_config.json said add_bos_token false and tokenizer.json had no post-processor: transformers
    encoded our checkpoints without the BOS the engine prepends (and the model was trained with)."""
    tok = build_char_tokenizer()
    save_model(CausalLM(_config(tok, pad_token_id=0)), tok, tmp_path)
    conf = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert conf["add_bos_token"] is True and conf["model_max_length"] == 96
    ours, theirs = load_tokenizer(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (ours.bos_id, ours.eos_ids, ours.pad_id) == (tok.bos_id, tok.eos_ids, tok.pad_id)
    for text in TEXTS:
        assert ours.encode(text) == theirs(text)["input_ids"] == tok.encode(text), text
    assert tok.tok.post_processor is None  # saving left the tokenizer in memory as it was


def test_a_saved_byte_level_checkpoint_names_its_own_special_tokens(tmp_path):
    """``<bos>``/``<eos>``/``<pad>`` were named whatever the vocabulary held: transformers added them as
    new tokens past the model's vocabulary, and padded and stopped on ids the model does not have."""
    tok = _byte_level()
    save_model(CausalLM(_config(tok)), tok, tmp_path)
    conf = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (conf["bos_token"], conf["eos_token"], conf["pad_token"], conf["add_bos_token"]) == (
        None, "<|im_end|>", "<|im_end|>", False)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert len(theirs) == tok.vocab_size
    assert (theirs.eos_token_id, theirs.pad_token_id) == (tok.eos_ids[0], tok.pad_id)
    _, again = load_model(tmp_path)
    for text in TEXTS:
        assert again.encode(text) == theirs(text)["input_ids"] == tok.encode(text), text


def _folder(tmp: Path, pad_token=None, **config) -> Path:
    tok = _byte_level()
    tok.tok.save(str(tmp / "tokenizer.json"))
    (tmp / "config.json").write_text(json.dumps({**_config(tok).to_hf_dict(), **config}))
    conf = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>"}
    conf |= {"pad_token": pad_token} if pad_token else {}
    (tmp / "tokenizer_config.json").write_text(json.dumps(conf))
    return tmp


@pytest.mark.parametrize("pad_token", ["<|endoftext|>", {"__type": "AddedToken", "content": "<|endoftext|>",
                                                         "special": True}])
def test_pad_is_the_tokenizer_configs_pad_token(tmp_path, pad_token):
    """Qwen2.5 Instruct pads with <|endoftext|>, not its EOS: the pad id was the first EOS."""
    folder = _folder(tmp_path, pad_token=pad_token, pad_token_id=None)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    endoftext = theirs.convert_tokens_to_ids("<|endoftext|>")
    assert load_tokenizer(folder).pad_id == theirs.pad_token_id == endoftext


def test_pad_is_config_pad_token_id_without_a_pad_token(tmp_path):
    endoftext = _byte_level().tok.token_to_id("<|endoftext|>")
    assert load_tokenizer(_folder(tmp_path, pad_token_id=endoftext)).pad_id == endoftext
    eos = _byte_level().eos_ids[0]  # a -1 (old Llama configs) or an id past the vocabulary is not used
    assert load_tokenizer(_folder(tmp_path, pad_token_id=-1)).pad_id == eos


def test_a_bos_id_outside_the_vocabulary_is_named(tmp_path):
    """It was an IndexError in the embedding at the first prompt, not an error at load naming the file."""
    tok = build_char_tokenizer()
    save_model(CausalLM(_config(tok, pad_token_id=0)), tok, tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        json.loads((tmp_path / "tokenizer.json").read_text()) | {"post_processor": None}))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"bos_token_id": 500}))
    with pytest.raises(ValueError, match=r"config.json: bos_token_id 500 is outside the vocabulary"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_model(tmp_path)[1].bos_id == tok.bos_id
