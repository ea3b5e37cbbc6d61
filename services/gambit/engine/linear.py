"""CPU fp32 linear layers: the weight layout and kernel chosen by measurement.

Three modes (``EngineConfig.cpu_linear``):

* ``"transposed"`` (default): every weight is re-laid out in memory as its contiguous transpose
  ``[in, out]`` and kept as a ``.t()`` view, so the model still sees ``[out, in]`` weights and calls
  ``F.linear`` unchanged, but oneDNN/MKL multiply ``x @ Wᵀ`` with a non-transposed, row-contiguous B.
  No extra memory for the layers (only the tied LM head, which is also the embedding table, gets a
  transposed copy). Measured at SmolLM2-135M's shapes, one thread, interleaved medians: 1.3-1.8×
  ``F.linear`` on row-major weights at 16 and 64 rows, and 21 against 17 GB/s on a batch-1 step.
* ``"packed"``: MKL's prepacked fp32 GEMM (``torch.ops.mkl._mkl_linear`` on weights packed once,
  what inductor's freezing emits); a second copy of every weight. Fast at 16 rows, slower than the
  transposed layout at 64 rows and at one row, so no longer the default.
* ``"plain"``: row-major weights and ``F.linear`` (what ``transformers`` runs).

A packed weight remembers its tensor's version: if the weight is modified in place afterwards the
fast path steps aside (plain ``F.linear``) instead of using stale numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gambit.cpu_info import CPU_WEIGHTS, cpu_vendor
from gambit.engine import cpu_attention, cpu_gemv, cpu_invariant
from gambit.model.layers import RMSNorm
from gambit.model.llama import CausalLM

CPU_LINEAR_MODES = ("transposed", "packed", "plain")
PACK_BACKENDS = ("mkl", "onednn", "onednn-bf16", "invariant", "invariant-bf16")
_generation = 0  # bumped whenever fast paths are installed or cleared (cpu_decoder caches on it)


def generation() -> int:
    return _generation


def mkl_available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def gemm_vendor() -> str:
    """The vendor whose GEMM choices ``packing_backend`` follows: ``GAMBIT_GEMM_VENDOR`` when set, else
    this CPU's. Training's ``isa="compatible"`` sets it (``gambit.train.repro.ISA_ENV``), so the data an
    engine writes under it takes the same GEMMs on every CPU: with this CPU's choice an Intel host wrote
    other rollouts than the AMD ones the cards came from (stop 43)."""
    return os.environ.get("GAMBIT_GEMM_VENDOR") or cpu_vendor()


# On AMD CPUs MKL's GEMM takes slower code paths. oneDNN's packed GEMM beat MKL's packed one 1.5x over a
# SmolLM2-135M layer at 16 rows and its LM head 2x at 16 and 64 rows (2-core AMD EPYC), and the shipped
# 2.7M target's qkv, gate_up and down weights (98K-197K elements) 1.3-2x from 3 to 96 rows (Zen 5;
# `gambit bench linears --model services/gambit/assets/target`). Its smaller o (37K) and head (19K)
# stay on F.linear over the transposed layout, which beat both packed GEMMs there up to 49 rows; one
# row of any weight also stays there (or streams), where oneDNN's call costs ~13 µs more than MKL's.
# On Intel MKL's packed GEMM measured fastest at 2-32 rows, for every weight.
ONEDNN_MIN_ELEMENTS = 1 << 16
ONEDNN_MIN_ROWS = 2
# One-row products of weights at least this large stream through ``cpu_gemv`` (its sums run in another
# order than MKL's, so the shipped target, whose weights are all smaller, keeps its floats).
STREAM_MIN_ELEMENTS = 1 << 18


def packing_backend(weight: torch.Tensor, vendor: str | None = None) -> str:
    """Which packed GEMM serves this weight's multi-row products here: "onednn", "mkl", or "" (none:
    ``F.linear`` on the transposed layout, what an AMD CPU runs fastest for small weights)."""
    vendor = gemm_vendor() if vendor is None else vendor
    if vendor == "AuthenticAMD" and onednn_available():
        return "onednn" if weight.numel() >= ONEDNN_MIN_ELEMENTS else ""
    return "mkl"


class PackedLinear:
    """A packed weight (MKL's, or oneDNN's with ``backend="onednn"``) for ``min_rows <= rows <=
    max_rows``; with ``stream`` (the weight's contiguous ``[in, out]`` storage) one-row products go
    through ``cpu_gemv``; ``F.linear`` (or ``fallback``) else. ``backend="onednn-bf16"``: an fp32
    weight (already rounded to bfloat16 values) packed as bfloat16 for oneDNN (AMX / AVX512-BF16);
    its fp32 rows are rounded to bfloat16 for the product and its output comes back as fp32, and
    ``stream`` may be the bfloat16 ``[in, out]`` copy. ``backend="invariant"`` / ``"invariant-bf16"``:
    every row count on ``cpu_invariant``'s tiles (fp32, or the weight's bfloat16 values), each row's
    floats those of the row alone (``EngineConfig.batch_invariant``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, min_rows: int,
                 max_rows: int = 1 << 30, fallback: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 backend: str = "mkl", stream: torch.Tensor | None = None) -> None:
        if backend not in PACK_BACKENDS:
            raise ValueError(f"backend must be one of {PACK_BACKENDS}, got {backend!r}")
        if stream is not None and (not stream.is_contiguous() or stream.shape != weight.t().shape
                                   or bias is not None):
            raise ValueError("stream must be the weight's contiguous [in, out] transpose, without bias")
        self.weight, self.bias, self.min_rows, self.max_rows = weight, bias, min_rows, max_rows
        self.stream = stream
        self.fallback = fallback or (lambda x: F.linear(x, self.weight, self.bias))
        self.version = weight._version
        self.backend = backend
        with torch.no_grad():
            w = weight.detach().contiguous()
            if backend == "onednn-bf16":
                w = w.bfloat16()
            # oneDNN's bfloat16 product takes a bfloat16 bias: converted once, not per call
            self.bias16 = None if bias is None or backend != "onednn-bf16" else bias.detach().bfloat16()
            if backend.startswith("invariant"):
                self.packed = cpu_invariant.pack(w.t(), bf16=backend == "invariant-bf16")
            elif backend == "mkl":
                self.packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 16)
            else:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(w, 16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if (x.dtype != self.weight.dtype or self.weight._version != self.version
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))):
            return self.fallback(x)
        if self.backend.startswith("invariant"):
            out = cpu_invariant.linear(x, self.packed, self.weight.shape[0])
            return out if self.bias is None else out + self.bias
        if rows == 1 and self.stream is not None:
            return cpu_gemv.gemv(x, self.stream)
        if not self.min_rows <= rows <= self.max_rows:
            return self.fallback(x)
        x2 = x.reshape(rows, x.shape[-1])
        if self.backend == "onednn-bf16":
            out = torch.ops.mkldnn._linear_pointwise(x2.bfloat16(), self.packed, self.bias16, "none", [],
                                                     "").float()
        elif self.backend == "onednn":
            out = torch.ops.mkldnn._linear_pointwise(x2, self.packed, self.bias, "none", [], "")
        else:
            out = torch.ops.mkl._mkl_linear(x2, self.packed, self.weight, self.bias, rows)
        return out.view(*x.shape[:-1], out.shape[-1])


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """The same values as ``w`` [out, in], stored as a contiguous [in, out] and viewed back."""
    return w if w.stride() == (1, w.shape[0]) else w.t().contiguous().t()


def _relayout(model: CausalLM, transposed: bool) -> None:
    """Store every (fused) linear weight transposed, or back to row-major; views follow."""
    lay = _transposed if transposed else torch.Tensor.contiguous
    with torch.no_grad():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            if attn.qkv is not None:
                w = lay(attn.qkv[0])
                attn.qkv = (w, attn.qkv[1])
                start = 0
                for p in (attn.q_proj, attn.k_proj, attn.v_proj):
                    n = p.weight.shape[0]
                    p.weight.data = w[start:start + n]
                    start += n
            attn.o_proj.weight.data = lay(attn.o_proj.weight.data)
            if mlp.gate_up is not None:
                mlp.gate_up = lay(mlp.gate_up)
                n = mlp.gate_proj.weight.shape[0]
                mlp.gate_proj.weight.data, mlp.up_proj.weight.data = mlp.gate_up[:n], mlp.gate_up[n:]
            mlp.down_proj.weight.data = lay(mlp.down_proj.weight.data)
        if not model.config.tie_word_embeddings:
            model.lm_head.weight.data = lay(model.lm_head.weight.data)


def install_cpu_linears(model: CausalLM, mode: str = "transposed", packed_rows: tuple[int, int] = (2, 32),
                        stream: bool = True, weights: str = "float32", invariant: bool = False) -> str:
    """Lay out a fused fp32 CPU model's linears for ``mode``; returns the mode in effect.

    ``packed_rows``: the row counts served by MKL-packed copies (all rows ≥ 2 in "packed" mode).
    ``stream``: in "transposed" mode, one-row products of weights of at least ``STREAM_MIN_ELEMENTS``
    go through ``cpu_gemv`` (the tied LM head through its transposed copy).
    ``weights="bfloat16"`` ("transposed" mode, a CPU with oneDNN's bfloat16 GEMM): every linear weight
    (and the tied embedding) rounded to bfloat16 in place, its products on oneDNN-packed bfloat16
    copies at every row count and its one-row products streamed from a bfloat16 copy (half the bytes);
    activations, norms and the KV cache stay fp32. Returns "transposed-bf16".
    ``invariant`` ("transposed" mode, the compiled kernels): every linear of every size, at every row
    count, on ``cpu_invariant``'s tiles, and every RMSNorm through the one-row kernel, so a row's floats
    never depend on the rows beside it (``EngineConfig.batch_invariant``); bfloat16 weights need no
    oneDNN there. Returns "invariant" or "invariant-bf16".
    """
    if mode not in CPU_LINEAR_MODES:
        raise ValueError(f"cpu_linear must be one of {CPU_LINEAR_MODES}, got {mode!r}")
    if weights not in CPU_WEIGHTS:
        raise ValueError(f"cpu_weights must be one of {CPU_WEIGHTS}, got {weights!r}")
    bf16 = weights == "bfloat16"
    if bf16 and mode != "transposed":
        raise ValueError(f"cpu_weights=bfloat16 needs cpu_linear=transposed, got {mode!r}")
    if invariant and (mode != "transposed" or cpu_attention.kernel() is None):
        raise ValueError("batch_invariant needs cpu_linear=transposed and the compiled CPU kernels")
    if bf16 and not invariant and not bf16_gemm_available():
        raise ValueError("cpu_weights=bfloat16 needs oneDNN's bfloat16 GEMM (a CPU with AVX512-BF16 or AMX); "
                         "this one has neither: use cpu_weights=float32")
    clear_fast_paths(model)
    head = model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight
    if head.dtype == torch.bfloat16 and head.device.type == "cpu" and mode != "plain":
        return "onednn-bf16" if install_bf16_linears(model) else "plain"
    if head.dtype != torch.float32 or head.device.type != "cpu":
        return "plain"
    _relayout(model, transposed=mode == "transposed")
    if bf16:
        _round_to_bf16(model)
    head_fallback = head_t = None
    if mode == "transposed" and model.config.tie_word_embeddings:
        head_t = head.detach().t().contiguous()  # the embedding table stays row-major for lookups
        head_fallback = lambda x: torch.matmul(x, head_t)  # noqa: E731
        model.fast["head"] = head_fallback
    # one-row products of large weights: the streaming kernel, on the transposed layout only
    stream_rows = stream and mode == "transposed" and cpu_attention.kernel() is not None
    if mode == "plain" or not (mkl_available() or invariant):
        return mode if mode != "packed" else "plain"
    lo, hi = packed_rows if mode == "transposed" else (2, 1 << 30)

    def pack(fast: dict, key: str, w: torch.Tensor, b: torch.Tensor | None, fallback=None,
             wt: torch.Tensor | None = None) -> None:
        """``fast[key]``: the weight's PackedLinear, or nothing (F.linear) where no packing pays."""
        wt = w.t() if wt is None else wt
        stream = wt if stream_rows and b is None and w.numel() >= STREAM_MIN_ELEMENTS else None
        streamed.append(stream is not None)
        backend = packing_backend(w) if mode == "transposed" else "mkl"
        if invariant:  # every row count, every size: one order of summation
            fast[key] = PackedLinear(w, b, 1, 1 << 30, fallback,
                                     backend="invariant-bf16" if bf16 else "invariant")
        elif bf16:  # every row count on the bfloat16 pack; one row of a large weight streams its bf16 copy
            fast[key] = PackedLinear(w, b, 1, 1 << 30, fallback, backend="onednn-bf16",
                                     stream=None if stream is None else stream.bfloat16())
        elif backend == "onednn":  # one row: stream or F.linear
            fast[key] = PackedLinear(w, b, ONEDNN_MIN_ROWS, 1 << 30, fallback, backend="onednn",
                                     stream=stream)
        elif backend == "mkl":
            fast[key] = PackedLinear(w, b, lo, hi, fallback, stream=stream)
        elif fallback is not None:
            fast[key] = fallback

    streamed: list[bool] = []

    for fast, key, w, b in _layer_linears(model):
        pack(fast, key, w, b)
    layers_stream = any(streamed)
    pack(model.fast, "head", head, None, head_fallback, head_t)
    if invariant:
        for norm in _norms(model):  # one row at a time, whatever the rows beside it
            norm.fast = cpu_attention.rms_norm
        return "invariant-bf16" if bf16 else "invariant"
    if layers_stream:
        # a model large enough to stream: its RMSNorms in one kernel call each, not torch's ~7 (their
        # floats differ from F.rms_norm's in the last bits; the shipped target never gets here)
        for norm in _norms(model):
            norm.fast = cpu_attention.rms_norm
    return "transposed-bf16" if bf16 else mode


def _layer_linears(model: CausalLM):
    """(fast-path dict, key, weight, bias) of each fused linear of the decoder layers, in order."""
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv is not None:
            yield attn.fast, "qkv", *attn.qkv
        yield attn.fast, "o", attn.o_proj.weight, attn.o_proj.bias
        if mlp.gate_up is not None and mlp.gate_proj.bias is None:
            yield mlp.fast, "gate_up", mlp.gate_up, None
        yield mlp.fast, "down", mlp.down_proj.weight, mlp.down_proj.bias


def _round_to_bf16(model: CausalLM) -> None:
    """Every weight matrix (the linears, the head or tied embedding) to its nearest bfloat16 value, in
    place: the fallbacks and the packs then multiply the same weights. The fused projections are the
    parameters' storage, so they follow."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.bfloat16())


def bf16_gemm_available() -> bool:
    """oneDNN can multiply bfloat16 here (AVX512-BF16 or AMX; ATen would otherwise convert)."""
    return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def install_bf16_linears(model: CausalLM) -> bool:
    """A bfloat16 CPU model's linears as oneDNN-packed bfloat16 weights, every row count (AMX where the
    CPU has it): ``F.linear`` on a bfloat16 weight reorders it on every call. Returns whether it did."""
    if not bf16_gemm_available():
        return False

    def pack(fast: dict, key: str, w: torch.Tensor, b: torch.Tensor | None) -> None:
        if w.dtype == torch.bfloat16:  # a fused copy made before the model's .to() keeps its dtype
            fast[key] = PackedLinear(w, b, 1, backend="onednn")

    for fast, key, w, b in _layer_linears(model):
        pack(fast, key, w, b)
    head = model.model.embed_tokens.weight if model.config.tie_word_embeddings else model.lm_head.weight
    pack(model.fast, "head", head, None)
    return True


def _norms(model: CausalLM) -> list[RMSNorm]:
    return [m for m in model.modules() if isinstance(m, RMSNorm)]


def clear_fast_paths(model: CausalLM) -> None:
    """Back to plain ``F.linear`` calls everywhere (frees packed or transposed copies)."""
    global _generation
    _generation += 1
    for layer in model.model.layers:
        layer.self_attn.fast.clear()
        layer.mlp.fast.clear()
    model.fast.clear()
    for norm in _norms(model):
        norm.fast = None


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
    if not enabled or not mkl_available() or w.dtype != torch.float32 or w.device.type != "cpu":
        return 0
    if norm_kernel and cpu_attention.kernel() is not None:  # one call per norm, not torch's ~7
        for norm in norms:
            norm.fast = cpu_attention.rms_norm
    # per weight as the target's (``packing_backend``): MKL on Intel; on AMD oneDNN for the weights of
    # at least ONEDNN_MIN_ELEMENTS (MKL's few-row GEMM there is 2-6x slower at a real model's width) and
    # no pack for smaller ones (F.linear); the C++ forward takes unpacked weights and one packed kind

    def pack(fast: dict, key: str, x: torch.Tensor, b: torch.Tensor | None = None, kind: str | None = None
             ) -> None:
        kind = packing_backend(x) if kind is None else kind
        if kind:
            fast[key] = PackedLinear(x, b, min_rows, backend=kind)

    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = getattr(attn, "qkv", None)
        if qkv is not None:  # q and kv follow qkv (the C++ forward serves q's rows with qkv's range)
            n_q, kind = attn.n_heads * attn.head_dim, packing_backend(qkv)
            for key, x in (("qkv", qkv), ("q", qkv[:n_q]), ("kv", qkv[n_q:])):
                pack(attn.fast, key, x, kind=kind)
        pack(attn.fast, "o", attn.o_proj.weight)
        if mlp.gate_up is not None and mlp.gate_proj.bias is None:
            pack(mlp.fast, "gate_up", mlp.gate_up)
        pack(mlp.fast, "down", mlp.down_proj.weight, mlp.down_proj.bias)
    pack(drafter.fast, "fc", drafter.fc.weight)
    pack(drafter.fast, "head", w)
    return len(drafter.fast) + sum(len(x.self_attn.fast) + len(x.mlp.fast) for x in layers)
