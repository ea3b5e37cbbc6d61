"""Model configuration read from (and written to) a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3")


def check_family(model_type: str) -> None:
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a family this engine runs; "
                         f"one of {', '.join(FAMILIES)}")


ROPE_TYPES = ("default", "linear", "llama3")  # others (dynamic, yarn, longrope) are refused, not ignored


def _rope_scaling(scaling) -> dict:
    """``rope_scaling`` with the legacy "type" key read as "rope_type" (so to_hf_dict writes the real
    kind), checked: a kind this engine does not compute is an error, never RoPE without the scaling."""
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a JSON object or null, got {scaling!r}")
    if scaling and "rope_type" not in scaling and "type" not in scaling:
        raise ValueError(f"rope_scaling names no rope_type: {scaling!r}")
    rope = {k: v for k, v in scaling.items() if k != "type"}
    kind = rope.setdefault("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope type {kind!r} is not supported ({', '.join(ROPE_TYPES)})")
    need = {"default": (), "linear": ("factor",),
            "llama3": ("factor", "original_max_position_embeddings")}[kind]
    if any(k not in rope for k in need):
        raise ValueError(f"{kind} rope scaling needs {need}, got {sorted(rope)}")
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        v = rope.get(k)
        if k in rope and (isinstance(v, bool) or not isinstance(v, int | float) or not v > 0):
            raise ValueError(f"rope scaling {k} must be a positive number, got {v!r}")
    if kind == "llama3" and rope.get("high_freq_factor", 4.0) <= rope.get("low_freq_factor", 1.0):
        raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor")
    return rope


@dataclass
class ModelConfig:
    """Llama-family decoder: Llama 3 (llama3 or linear RoPE scaling), Qwen2 (q/k/v bias), Qwen3 (q/k norm)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3" | "linear", "factor", ...}
    tie_word_embeddings: bool = False
    model_type: str = "llama"
    attention_bias: bool = False  # q/k/v/o bias (Llama, Qwen3); Qwen2 always has q/k/v bias, no o bias
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    extra: dict = field(default_factory=dict)  # keys we keep but do not use

    def __post_init__(self) -> None:
        check_family(self.model_type)
        # sizes are checked before deriving head_dim, so num_attention_heads=0 is a ValueError
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if value is None and name in ("num_key_value_heads", "head_dim"):
                continue
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError("hidden_size must be divisible by num_attention_heads")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        # a null or a string here ran: a null rms_norm_eps became torch's default (1.2e-7, silently
        # other logits), a null or string rope_theta a TypeError from deep inside the rotary table
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias"):
            if getattr(self, name) is None:  # null reads as absent, as transformers' truth test reads it
                setattr(self, name, False)
            elif not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.rope_scaling is not None:
            self.rope_scaling = _rope_scaling(self.rope_scaling)

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:  # Llama and Qwen3 bias o_proj with attention_bias; Qwen2 never does
        return self.model_type != "qwen2" and self.attention_bias

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    @property
    def eos_ids(self) -> list[int]:
        e = self.eos_token_id
        return [] if e is None else ([e] if isinstance(e, int) else list(e))

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        check_family(d.get("model_type", "llama"))  # before the fields it lacks (a GPT-2 config has none)
        d = dict(d)
        rope = d.pop("rope_parameters", None)  # transformers >= 5 layout
        if rope is not None and not isinstance(rope, dict):
            raise ValueError(f"rope_parameters must be a JSON object, got {rope!r}")
        if rope is not None:
            # a null legacy key beside it is absent (setdefault kept it: llama3 scaling was dropped)
            if d.get("rope_theta") is None:
                d["rope_theta"] = rope.get("rope_theta", 10000.0)
            kind = rope.get("rope_type", rope.get("type", "default"))
            if kind != "default" and d.get("rope_scaling") is None:
                d["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
        scaling = d.get("rope_scaling")
        if isinstance(scaling, dict) and (not scaling
                                          or scaling.get("rope_type", scaling.get("type")) == "default"):
            d["rope_scaling"] = None  # {} and {"rope_type": "default"}: no scaling
        known = set(cls.__dataclass_fields__) - {"extra"}
        extra = {k: v for k, v in d.items() if k not in known}
        return cls(**{k: v for k, v in d.items() if k in known}, extra=extra)

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no config.json in the model folder") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON at line {e.lineno}: {e.msg}") from None
        if not isinstance(d, dict):
            raise ValueError(f"{path}: config must be a JSON object")
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: invalid model config: {e}") from None

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("extra", "rope_scaling", "rope_theta")}
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default",
                                **(self.rope_scaling or {})}
        d["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                               "qwen3": "Qwen3ForCausalLM"}[self.model_type]]
        d["hidden_act"] = "silu"
        return {**self.extra, **d}
