"""Convert a llama.cpp GGUF checkpoint (Llama architecture) to a Hugging Face folder in fp32.

What the conversion has to undo or rebuild:
* quantised blocks (Q4_1, Q8_0, ...) are dequantised with the ``gguf`` package's reader;
* llama.cpp's converter interleaves the rows of ``q_proj`` and ``k_proj`` per head (its RoPE pairs
  adjacent dimensions, Hugging Face's pairs the two halves): rows ``(head, half, i)`` were stored as
  ``(head, i, half)``, so each head's rows are de-interleaved back;
* the tokenizer lives in metadata (``tokenizer.ggml.*``): byte-level BPE vocabulary, merges, token
  types (3 = control → special) and the pre-tokenizer family; it becomes a ``tokenizer.json``;
* whether the tokenizer adds BOS (``add_bos_token``) decides ``bos_token_id`` in ``config.json`` and a
  BOS template in ``tokenizer.json`` (Llama 3.x adds one, SmolLM2 none);
* ``rope_freqs.weight`` (Llama 3.x) holds the llama3 RoPE scaling as per-frequency divisors: it becomes
  ``rope_scaling`` (checked against the factors it computes), not a weight.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

# per-layer GGUF tensor names → Hugging Face names
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
# llama.cpp pre-tokenizer families we can rebuild (byte-level BPE): GPT-2's split, with single digits
# (SmolLM), or Llama 3's (digits in threes; llama.cpp and transformers also ignore merges for it)
_PRE = {"smollm": "digits", "gpt2": "gpt2", "default": "gpt2", "llama-bpe": "llama3"}
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleave of q/k projections ([n_heads * D, ...])."""
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _meta(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def read_config(reader) -> dict:
    """Hugging Face ``config.json`` contents from ``llama.*`` metadata."""
    arch = _meta(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (llama only)")
    names = {t.name for t in reader.tensors}
    heads = int(_meta(reader, "llama.attention.head_count"))
    hidden = int(_meta(reader, "llama.embedding_length"))
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    add_bos = bool(_meta(reader, "tokenizer.ggml.add_bos_token", True))
    head_dim = _meta(reader, "llama.attention.key_length", _meta(reader, "llama.rope.dimension_count"))
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": int(_meta(reader, "llama.vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(_meta(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_meta(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_meta(reader, "llama.attention.head_count_kv", heads)),
        "head_dim": int(hidden // heads if head_dim is None else head_dim),
        "max_position_embeddings": int(_meta(reader, "llama.context_length")),
        "rms_norm_eps": float(f"{float(_meta(reader, 'llama.attention.layer_norm_rms_epsilon')):.6g}"),
        "rope_theta": float(_meta(reader, "llama.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, names),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(_meta(reader, "tokenizer.ggml.bos_token_id")) if add_bos else None,
        "eos_token_id": int(_meta(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": _meta(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _rope_scaling(reader, names: set[str]) -> dict | None:
    """``llama.rope.scaling.*`` as Hugging Face ``rope_scaling``: it was not read, so a linear-scaled
    checkpoint converted to plain RoPE (other logits past the first positions, without a word)."""
    if "rope_freqs.weight" in names:  # llama.cpp stores Llama 3.x's scaling as per-frequency factors
        return _llama3_scaling(reader)
    kind = _meta(reader, "llama.rope.scaling.type", "none")
    factor = _meta(reader, "llama.rope.scaling.factor")
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind != "linear":
        raise ValueError(f"GGUF rope scaling {kind!r} is not supported (none, linear)")
    return {"rope_type": "linear", "factor": float(factor)}


def _llama3_scaling(reader) -> dict | None:
    """``rope_freqs.weight`` (the divisor of each RoPE frequency llama.cpp's converter writes for
    ``rope_type: llama3``) as that ``rope_scaling``. The tensor does not carry the parameters: factor is
    its largest entry, the rest are the converter's and Llama 3.1-3.3's (low 1, high 4, original context
    8192 unless the GGUF names one); the factors they compute must equal the tensor's, else an error
    (a refusal made every Llama 3.x GGUF unloadable)."""
    from gguf.quants import dequantize

    from gambit.model.config import ModelConfig
    from gambit.model.layers import rope_inv_freq

    t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
    got = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)).reshape(-1)
    heads = int(_meta(reader, "llama.attention.head_count"))
    hidden = int(_meta(reader, "llama.embedding_length"))
    dim = int(_meta(reader, "llama.rope.dimension_count", hidden // heads))
    if got.numel() != dim // 2 or not bool((got >= 1).all()):
        raise ValueError(f"GGUF rope_freqs.weight: expected {dim // 2} factors >= 1 (one per RoPE "
                         f"frequency of head dimension {dim}), got {got.numel()} values, min {got.min():.3g}")
    if bool((got == 1).all()):
        return None
    scaling = {"rope_type": "llama3", "factor": float(f"{got.max().item():.6g}"), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings":
               int(_meta(reader, "llama.rope.scaling.original_context_length", 8192))}
    theta = float(_meta(reader, "llama.rope.freq_base", 10000.0))
    shape = {"vocab_size": 1, "hidden_size": dim, "intermediate_size": 1, "num_hidden_layers": 1,
             "num_attention_heads": 1, "rope_theta": theta}
    plain = rope_inv_freq(ModelConfig(**shape))
    want = plain / rope_inv_freq(ModelConfig(**shape, rope_scaling=scaling))
    if not torch.allclose(got, want, rtol=1e-5, atol=0):
        raise ValueError(f"GGUF rope_freqs.weight is not llama3 rope scaling with {scaling} "
                         f"(largest difference {(got - want).abs().max().item():.3g}): not supported")
    return scaling


def read_state_dict(reader, config: dict) -> dict[str, torch.Tensor]:
    """Every tensor dequantised to fp32 under its Hugging Face name, q/k rows de-interleaved."""
    from gguf.quants import dequantize

    state = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":  # computed from config.json's rope_scaling (see _llama3_scaling)
            continue
        if t.name in _GLOBAL:
            name = _GLOBAL[t.name]
        else:
            parts = t.name.split(".")  # blk.{i}.{kind}.weight
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER:
                raise ValueError(f"GGUF tensor {t.name!r} has no Hugging Face counterpart")
            name = f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{parts[3]}"
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists the fastest dimension first
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))  # a copy
        w = w.reshape(shape)
        if name.endswith("q_proj.weight"):
            w = unpermute_rows(w, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = unpermute_rows(w, config["num_key_value_heads"])
        state[name] = w.contiguous()
    return state


def build_tokenizer(reader):
    """A ``tokenizers.Tokenizer`` (byte-level BPE) from ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    kind, pre = _meta(reader, "tokenizer.ggml.model"), _meta(reader, "tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in _PRE:
        raise ValueError(f"GGUF tokenizer {kind!r}/{pre!r} is not supported (byte-level BPE: "
                         f"gpt2 with pre-tokenizer {sorted(_PRE)})")
    tokens = list(_meta(reader, "tokenizer.ggml.tokens"))
    types = list(_meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _meta(reader, "tokenizer.ggml.merges")]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                 unk_token=None, fuse_unk=False, byte_fallback=False,
                                 ignore_merges=_PRE[pre] == "llama3"))
    if _PRE[pre] == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.pre_tokenizer = (byte_level if _PRE[pre] == "gpt2" else pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    bos = _meta(reader, "tokenizer.ggml.bos_token_id")
    if bool(_meta(reader, "tokenizer.ggml.add_bos_token", True)) and bos is not None:
        # the BOS in the file, as Llama 3's tokenizer.json has it: transformers reads only this (not
        # tokenizer_config.json's add_bos_token), so it encoded without the BOS the engine prepends
        name = tokens[int(bos)]
        tok.post_processor = processors.Sequence([tok.post_processor, processors.TemplateProcessing(
            single=f"{name}:0 $A:0", pair=f"{name}:0 $A:0 {name}:1 $B:1", special_tokens=[(name, int(bos))])])
    # control (3) and user-defined (4) tokens match whole before BPE; control ones are special
    tok.add_tokens([AddedToken(tokens[i], special=types[i] == 3, normalized=False)
                    for i in range(len(tokens)) if types[i] in (3, 4)])
    return tok


def tokenizer_config(reader) -> dict:
    """``tokenizer_config.json`` so transformers' AutoTokenizer (and its chat template) work."""
    tokens = _meta(reader, "tokenizer.ggml.tokens")

    def name(key: str) -> str | None:
        i = _meta(reader, f"tokenizer.ggml.{key}")
        return None if i is None else tokens[int(i)]

    out = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name("bos_token_id"),
           "eos_token": name("eos_token_id"), "unk_token": name("unknown_token_id"),
           "pad_token": name("padding_token_id"),
           "add_bos_token": bool(_meta(reader, "tokenizer.ggml.add_bos_token", True)),
           "model_max_length": int(_meta(reader, "llama.context_length"))}
    template = _meta(reader, "tokenizer.chat_template")
    if template:
        out["chat_template"] = template
    return out


def convert_gguf(gguf_path: str | Path, out: str | Path, card: str = "") -> Path:
    """Write ``out`` (must not exist yet) as a Hugging Face folder from ``gguf_path``."""
    from gguf import GGUFReader
    from safetensors.torch import save_file

    out = Path(out)
    reader = GGUFReader(str(gguf_path))
    config = read_config(reader)
    state = read_state_dict(reader, config)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    build_tokenizer(reader).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(reader), indent=2))
    gen = {"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if card:
        (out / "README.md").write_text(card)
    return out
