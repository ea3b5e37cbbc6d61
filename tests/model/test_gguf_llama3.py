"""A Llama 3.x GGUF as llama.cpp's converter writes it (``rope_freqs.weight``, the ``llama-bpe``
pre-tokenizer, a BOS the tokenizer adds), converted and checked against the transformers model and
tokenizer it came from. It was refused (rope_freqs.weight, then the pre-tokenizer)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gambit.model import load_model
from gambit.model.gguf_import import convert_gguf
from gambit.model.loader import load_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = ["Step 1: 12345 + 678 = 13023\n\nStep 2: done.", "héllo  wörld's\r\n\ttab 😀", "<|end_of_text|>x"]


def _reference_tokenizer():
    """A small Llama-3-style tokenizer (trained here, no hub): Split + ByteLevel, BOS template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["The 123 quick brown fox's 4567 jumps\n\nover the lazy dog."] * 20 + TEXTS,
                            trainer)
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                              processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])])
    return tok


def _interleave(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_factors(theta: float, dim: int) -> np.ndarray:
    """What llama.cpp's ``convert_hf_to_gguf.py`` writes as rope_freqs.weight for llama3 scaling."""
    freqs = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    s, out = SCALING, []
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(s["factor"])
        else:
            smooth = ((s["original_max_position_embeddings"] / wl - s["low_freq_factor"])
                      / (s["high_freq_factor"] - s["low_freq_factor"]))
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(out, dtype=np.float32)


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama3")
    tok = _reference_tokenizer()
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    cfg = transformers.LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, rope_theta=500000.0,
                                   rope_scaling=dict(SCALING), tie_word_embeddings=True, bos_token_id=0,
                                   eos_token_id=1, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            p.normal_(1.0 if "norm" in n else 0.0, 0.1)
    w = gguf.GGUFWriter(str(tmp / "m.gguf"), "llama")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_rope_dimension_count(16)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    w.add_tensor("rope_freqs.weight", _rope_factors(500000.0, 16))
    for k, v in hf.state_dict().items():
        a = v.numpy().astype(np.float32)
        if k == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", a)
        elif k == "model.norm.weight":
            w.add_tensor("output_norm.weight", a)
        elif k.startswith("model.layers."):
            _, _, i, *mid, last = k.split(".")
            if mid[-1] in ("q_proj", "k_proj"):
                a = _interleave(a, 4 if mid[-1] == "q_proj" else 2)
            w.add_tensor(f"blk.{i}.{names['.'.join(mid)]}.{last}", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return convert_gguf(tmp / "m.gguf", tmp / "hf"), hf, tok


def test_llama3_gguf_rope_freqs_become_its_rope_scaling(llama3):
    folder, hf, _ = llama3
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_scaling"] == SCALING
    model, tok = load_model(folder)
    ids = torch.randint(2, 300, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model.logits(model(ids)[0]) - hf(ids).logits).abs().max().item() <= 1e-4


def test_llama3_gguf_tokenizer_encodes_as_the_original(llama3):
    folder, _, ref = llama3
    ours = load_tokenizer(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.bos_id == 0
    for text in TEXTS:
        want = ref.encode(text).ids
        assert want[0] == 0 and ours.encode(text) == want == theirs(text)["input_ids"], text
        assert ours.decode(want) == ref.decode(want)


def test_rope_freqs_that_are_not_llama3_scaling_are_refused(llama3):
    """A factor table the llama3 formula does not give is an error naming it, never plain RoPE."""
    from gambit.model.gguf_import import _llama3_scaling

    class Tensor:
        name, tensor_type = "rope_freqs.weight", gguf.GGMLQuantizationType.F32

        def __init__(self, data):
            self.data = data

    class Field:
        def __init__(self, v):
            self.v = v

        def contents(self):
            return self.v

    def reader(data):
        meta = {"llama.attention.head_count": 4, "llama.embedding_length": 64,
                "llama.rope.dimension_count": 16, "llama.rope.freq_base": 500000.0}
        return type("R", (), {"tensors": [Tensor(data)], "fields": {k: Field(v) for k, v in meta.items()}})()

    good = _rope_factors(500000.0, 16)
    assert _llama3_scaling(reader(good)) == SCALING
    assert _llama3_scaling(reader(np.ones(8, dtype=np.float32))) is None
    with pytest.raises(ValueError, match="rope_freqs.weight is not llama3 rope scaling"):
        _llama3_scaling(reader(np.where(good > 1, 2 * good, good).astype(np.float32)))
    with pytest.raises(ValueError, match="expected 8 factors >= 1 .*got 5 values"):
        _llama3_scaling(reader(good[:5]))
