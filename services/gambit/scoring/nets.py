"""The scorer networks: STEP's MLP probe and the history-aware sequence model.

Each returns logits (sigmoid gives the score). The sequence model has two paths that agree: a
whole-sequence ``forward`` (training, offline evaluation) and an incremental ``step`` that carries a
per-trace state (serving: one boundary at a time, forkable by copying the state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gambit.scoring.config import ScorerConfig


class MLPNet(nn.Sequential):
    """STEP: ``Sequential(Linear(d, 512), ReLU, Linear(512, 1))`` on one boundary state.

    A ``Sequential`` itself, so its weights are named as STEP's (``0.weight`` ... ``2.bias``).
    """

    def __init__(self, cfg: ScorerConfig) -> None:
        super().__init__(nn.Linear(cfg.input_size, cfg.mlp_hidden), nn.ReLU(), nn.Linear(cfg.mlp_hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d] -> [...]`` logits: the three modules' own functions, called directly (the same
        ops, so the same floats, without ``Sequential``'s per-module dispatch: ~20 us of a ~100 us
        guidance call)."""
        first, last = self[0], self[2]
        return F.linear(F.relu(F.linear(x, first.weight, first.bias)), last.weight, last.bias).squeeze(-1)


class SequenceNet(nn.Module):
    """Boundary history ``[B, T, d]`` → logit per prefix ``[B, T]`` (causal: position j sees 1..j)."""

    def __init__(self, cfg: ScorerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D = cfg.model_dim
        self.in_norm = nn.LayerNorm(cfg.input_size)
        self.proj = nn.Linear(cfg.input_size, D)
        if cfg.arch == "gru":
            self.gru = nn.GRU(D, D, batch_first=True)
        else:
            self.pos = nn.Embedding(cfg.max_thoughts, D)
            self.norm1 = nn.LayerNorm(D)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.norm2 = nn.LayerNorm(D)
            self.mlp = nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
        self.head_norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, 1)

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.proj(self.in_norm(x)))

    def _attn_block(self, h: torch.Tensor) -> torch.Tensor:
        B, T, D = h.shape
        idx = torch.arange(T, device=h.device).clamp(max=self.cfg.max_thoughts - 1)
        h = h + self.pos(idx)
        q, k, v = self.qkv(self.norm1(h)).view(B, T, 3, self.cfg.num_heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.out(a.transpose(1, 2).reshape(B, T, D))
        return h + self.mlp(self.norm2(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, d] -> [B, T]`` logits; right padding never changes earlier positions."""
        h = self._embed(x)
        h = self.gru(h)[0] if self.cfg.arch == "gru" else self._attn_block(h)
        return self.head(self.head_norm(h)).squeeze(-1)

    # -- incremental path -------------------------------------------------------------------
    def init_state(self) -> torch.Tensor:
        """State of a trace with no boundary yet: GRU hidden ``[D]``, or attn history ``[0, d]``."""
        p = self.head.weight
        if self.cfg.arch == "gru":
            return torch.zeros(self.cfg.model_dim, dtype=p.dtype, device=p.device)
        return torch.zeros(0, self.cfg.input_size, dtype=p.dtype, device=p.device)

    def step(self, states: list[torch.Tensor], x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Append ``x[i]`` to trace i's state; new states and the logit of each extended history."""
        if self.cfg.arch == "gru":
            h0 = torch.stack(states)[None]  # [1, N, D]
            out, hn = self.gru(self._embed(x)[:, None], h0)
            return list(hn[0].unbind(0)), self.head(self.head_norm(out[:, 0])).squeeze(-1)
        hist = [torch.cat([s, x[i:i + 1]]) for i, s in enumerate(states)]
        lengths = torch.tensor([len(h) for h in hist], device=x.device)
        padded = nn.utils.rnn.pad_sequence(hist, batch_first=True)  # right padding
        logits = self.forward(padded)
        return hist, logits[torch.arange(len(hist), device=x.device), lengths - 1]


def build_net(cfg: ScorerConfig) -> nn.Module:
    return MLPNet(cfg) if cfg.kind == "mlp" else SequenceNet(cfg)
