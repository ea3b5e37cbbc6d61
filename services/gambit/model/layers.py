"""Building blocks: RMSNorm, rotary embeddings (default, linear and llama3 scaling), SwiGLU MLP."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gambit.model.config import ModelConfig

# an inference-time replacement for one F.linear (e.g. prepacked weights, see gambit.engine.linear)
FastLinear = Callable[[torch.Tensor], torch.Tensor]


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            fast: FastLinear | None = None) -> torch.Tensor:
    """``F.linear``, or the installed fast path for this weight."""
    return F.linear(x, weight, bias) if fast is None else fast(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.fast: Callable | None = None  # (x, weight, eps) -> y: an fp32 inference kernel, when installed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fast is not None and x.dtype == torch.float32 and not torch.is_grad_enabled():
            return self.fast(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # one fused op on the fp32 path
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # low precision: normalise in fp32, cast back, then scale (as transformers does)
        y = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * y.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies: linear scaling (positions / factor) or Llama 3.1's frequency-dependent one
    when configured (``ModelConfig`` refuses the kinds not computed here)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    s = config.rope_scaling
    kind = s.get("rope_type", s.get("type")) if s else "default"
    if kind == "linear":
        return inv_freq / s["factor"]
    if kind != "llama3":
        return inv_freq
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables (full head width, halves repeated) indexed by absolute position."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(config)
        t = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        freqs = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for ``positions`` [..., T], shaped to broadcast over heads: [..., T, 1, D]."""
        shape = (*positions.shape, 1, self.cos.shape[-1])
        flat = positions.reshape(-1)  # index_select: the rows themselves, without advanced indexing's setup
        return self.cos.index_select(0, flat).view(shape), self.sin.index_select(0, flat).view(shape)


def apply_rope(x: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate x [..., T, heads, D] (half-split layout) by a ``RotaryEmbedding.table``; math in fp32."""
    cos, sin = table
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    out = xf * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out.to(x.dtype)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, b = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=b)
        self.up_proj = nn.Linear(h, i, bias=b)
        self.down_proj = nn.Linear(i, h, bias=b)

        self.gate_up: torch.Tensor | None = None  # fused [2I, H] view for inference (see fuse())
        self.fast: dict[str, FastLinear] = {}  # "gate_up" / "down" fast paths (inference only)

    def fuse(self) -> None:
        """Serve gate and up from one matmul; their weights become views of the fused tensor."""
        fused = torch.cat((self.gate_proj.weight.data, self.up_proj.weight.data), dim=0)
        n = self.gate_proj.weight.shape[0]
        self.gate_proj.weight.data, self.up_proj.weight.data = fused[:n], fused[n:]
        self.gate_up = fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None and self.gate_proj.bias is None:
            gate, up = project(x, self.gate_up, None, self.fast.get("gate_up")).chunk(2, dim=-1)
            d = self.down_proj
            return project(F.silu(gate) * up, d.weight, d.bias, self.fast.get("down"))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
