"""Linear layers on the CPU through MKL's prepacked fp32 GEMM (what inductor's freezing emits).

``torch.ops.mkl._mkl_reorder_linear_weight`` packs a weight once into MKL's internal GEMM layout;
``torch.ops.mkl._mkl_linear`` then multiplies without re-packing it on every call. The packed copy
takes as much memory as the weight (the fp32 weights stay: state dicts, taps and fallbacks use them).
The pack format does not depend on the batch-size hint, so each call passes its own row count.

Chosen by measurement at SmolLM2-135M's shapes, fp32, interleaved medians (GFLOP/s, one thread,
a shared 2-core machine; see the README's engine section for the full table and command):
prepacked MKL beat ``F.linear`` by 1.1-1.5x at 16 and 64 rows on the layer shapes, oneDNN prepacked
weights (``mkldnn._linear_pointwise``) sat between the two, and ``torch.utils.mkldnn`` (which
converts every input and output) was slowest. ``torch.compile`` with freezing lowers fp32 linears
to this same MKL call, without its minutes of compile time per batch shape. At one row all are
memory-bound and equal within noise, so rows below ``min_rows`` keep ``F.linear``.

A packed weight remembers its tensor's version: if the weight is modified in place afterwards the
fast path steps aside (plain ``F.linear``) instead of using stale numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gambit.engine import cpu_attention
from gambit.model.layers import RMSNorm
from gambit.model.llama import CausalLM


def available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, min_rows: int) -> None:
        self.weight, self.bias, self.min_rows = weight, bias, min_rows
        self.version = weight._version
        with torch.no_grad():
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), 16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if (rows < self.min_rows or x.dtype != torch.float32 or self.weight._version != self.version
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])
        out = torch.ops.mkl._mkl_linear(x2, self.packed, self.weight, self.bias, rows)
        return out.view(*x.shape[:-1], out.shape[-1])


def pack_linears(model: CausalLM, enabled: bool = True, min_rows: int = 2) -> int:
    """(Re)install prepacked fast paths on a fused fp32 CPU model; returns how many (0: none)."""
    unpack_linears(model)
    if not enabled or not available():
        return 0
    head = model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight
    if head.dtype != torch.float32 or head.device.type != "cpu":
        return 0
    n = 0
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is not None:
            attn.fast["qkv"] = PackedLinear(*attn.qkv, min_rows)
        attn.fast["o"] = PackedLinear(attn.o_proj.weight, attn.o_proj.bias, min_rows)
        if mlp.gate_up is not None and mlp.gate_proj.bias is None:
            mlp.fast["gate_up"] = PackedLinear(mlp.gate_up, None, min_rows)
        mlp.fast["down"] = PackedLinear(mlp.down_proj.weight, mlp.down_proj.bias, min_rows)
        n += len(attn.fast) + len(mlp.fast)
    model.fast["head"] = PackedLinear(head, None, min_rows)
    return n + 1


def unpack_linears(model: CausalLM) -> None:
    """Back to plain ``F.linear`` everywhere (frees the packed copies)."""
    for layer in model.model.layers:
        layer.self_attn.fast.clear()
        layer.mlp.fast.clear()
    model.fast.clear()


def pack_drafter(drafter, enabled: bool = True, norm_kernel: bool = True, min_rows: int = 2) -> int:
    """The same fast paths for a fused fp32 CPU drafter (``gambit.speculative.Drafter``); with
    ``norm_kernel`` its RMSNorms also run through the compiled CPU kernel."""
    layers = (drafter.midlayer, *drafter.extra_layers)
    for d in (drafter.fast, *(x.self_attn.fast for x in layers), *(x.mlp.fast for x in layers)):
        d.clear()
    w = drafter.lm_head.weight
    norms = [mod for mod in drafter.modules() if isinstance(mod, RMSNorm)]
    for norm in norms:
        norm.fast = None
    if not enabled or not available() or w.dtype != torch.float32 or w.device.type != "cpu":
        return 0
    if norm_kernel and cpu_attention.kernel() is not None:  # one call per norm, not torch's ~7
        for norm in norms:
            norm.fast = cpu_attention.rms_norm
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = getattr(attn, "qkv", None)
        if qkv is not None:
            n_q = attn.n_heads * attn.head_dim
            attn.fast.update(qkv=PackedLinear(qkv, None, min_rows), q=PackedLinear(qkv[:n_q], None, min_rows),
                             kv=PackedLinear(qkv[n_q:], None, min_rows))
        attn.fast["o"] = PackedLinear(attn.o_proj.weight, None, min_rows)
        if mlp.gate_up is not None and mlp.gate_proj.bias is None:
            mlp.fast["gate_up"] = PackedLinear(mlp.gate_up, None, min_rows)
        mlp.fast["down"] = PackedLinear(mlp.down_proj.weight, mlp.down_proj.bias, min_rows)
    drafter.fast.update(fc=PackedLinear(drafter.fc.weight, None, min_rows),
                        head=PackedLinear(w, None, min_rows))
    return len(drafter.fast) + sum(len(x.self_attn.fast) + len(x.mlp.fast) for x in layers)
