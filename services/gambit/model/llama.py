"""Llama-family decoder returning final hidden states and any requested layer taps.

Attention is a pluggable function so the same weights run densely (training, parity tests) and
over a paged KV cache (the engine) without the model knowing about either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gambit.model.config import ModelConfig
from gambit.model.layers import MLP, FastLinear, RMSNorm, RotaryEmbedding, apply_rope, project

# (layer index, q [B,T,Hq,D], k [B,T,Hkv,D], v [B,T,Hkv,D]) -> [B,T,Hq,D]
AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense causal self-attention over the given tokens (no cache)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
        enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def eagle_taps(num_layers: int) -> tuple[int, int, int]:
    """Three distinct layers to tap for an EAGLE-3 drafter.

    The EAGLE-3 rule (2, L//2, L-3) where it gives three distinct layers inside the model; otherwise
    (shallow models, e.g. L = 6 gives (2, 3, 3)) three layers spread evenly over 1..L-1.
    """
    L = num_layers
    if L < 3:
        raise ValueError(f"an EAGLE-3 drafter taps three distinct layers; the target has only {L}")
    rule = (2, L // 2, L - 3)
    if len(set(rule)) == 3 and all(0 <= i < L for i in rule):
        return tuple(sorted(rule))
    spread = sorted({round(1 + (L - 2) * i / 2) for i in range(3)})
    return tuple(spread) if len(spread) == 3 else (0, 1, 2)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.n_heads, self.n_kv, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                  config.head_dim)
        h, b = config.hidden_size, config.qkv_bias
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=b)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=b)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=b)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fused, see fuse()
        self.fast: dict[str, FastLinear] = {}  # "qkv" / "o" fast paths (inference only)

    def fuse(self) -> None:
        """Serve q, k, v from one matmul (inference); their weights become views of the fused one.

        Call after the model reached its final device and dtype: a later ``.to()`` unshares them.
        """
        projs = (self.q_proj, self.k_proj, self.v_proj)
        weight = torch.cat([p.weight.data for p in projs], dim=0)
        bias = torch.cat([p.bias.data for p in projs], dim=0) if self.q_proj.bias is not None else None
        start = 0
        for p in projs:
            n = p.weight.shape[0]
            p.weight.data = weight[start:start + n]
            if bias is not None:
                p.bias.data = bias[start:start + n]
            start += n
        self.qkv = (weight, bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                attention: AttentionFn) -> torch.Tensor:
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv, self.head_dim
        if self.qkv is not None:
            qkv = project(x, *self.qkv, self.fast.get("qkv")).view(B, T, H + 2 * Hkv, D)
            if hasattr(self, "q_norm"):
                q, k, v = qkv.split((H, Hkv, Hkv), dim=2)
                q, k = apply_rope(self.q_norm(q), rope), apply_rope(self.k_norm(k), rope)
            else:
                qk, v = qkv.split((H + Hkv, Hkv), dim=2)
                q, k = apply_rope(qk, rope).split((H, Hkv), dim=2)
        else:
            q = self.q_proj(x).view(B, T, H, D)
            k = self.k_proj(x).view(B, T, Hkv, D)
            v = self.v_proj(x).view(B, T, Hkv, D)
            if hasattr(self, "q_norm"):
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        o = attention(self.layer, q, k, v)
        o = o.reshape(B, T, self.n_heads * self.head_dim)
        return project(o, self.o_proj.weight, self.o_proj.bias, self.fast.get("o"))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, attention):
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*`` in Hugging Face naming: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder-only LM. ``forward`` returns post-norm hidden states; ``logits`` applies the head.

    Taps: index ``i < L`` is the hidden state entering decoder layer ``i`` (the EAGLE-3 convention,
    pre-norm); index ``L`` is the post-final-norm output of the last layer (what a scorer reads).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.rope = RotaryEmbedding(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.fast: dict[str, FastLinear] = {}  # "head" fast path (inference only)

    @property
    def eagle_taps(self) -> tuple[int, int, int]:
        return eagle_taps(self.config.num_hidden_layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                attention: AttentionFn = causal_attention, taps: Sequence[int] = ()
                ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """input_ids, positions: [B, T] → (hidden [B, T, H] after the final norm, {tap: [B, T, H]})."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        L = self.config.num_hidden_layers
        x = self.model.embed_tokens(input_ids)
        tapped: dict[int, torch.Tensor] = {}
        rope = self.rope.table(positions)
        for i, layer in enumerate(self.model.layers):
            if i in taps:
                tapped[i] = x
            x = layer(x, rope, attention)
        x = self.model.norm(x)
        if L in taps:
            tapped[L] = x
        return x, tapped

    def fuse_projections(self) -> CausalLM:
        """Fuse q/k/v and gate/up matmuls for inference (weights stay shared with the originals)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def lm_head_weight(self) -> torch.Tensor:
        """[V, H]: the output head (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return project(hidden, self.lm_head_weight(), None, self.fast.get("head"))
