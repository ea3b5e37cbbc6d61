"""Bfloat16 weights on the CPU (``EngineConfig.cpu_weights="bfloat16"``, gambit/engine/linear.py): the
weights rounded to bfloat16, products on oneDNN's bfloat16 GEMM and the streamed one-row kernel,
activations fp32."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from engine_util import one_thread, tiny_model

from gambit.engine import Engine, EngineConfig, SamplingParams, cpu_attention, cpu_decoder, linear
from gambit.engine.cpu_gemv import gemv
from gambit.engine.linear import STREAM_MIN_ELEMENTS, PackedLinear, bf16_gemm_available, install_cpu_linears

needs_kernel = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")
needs_bf16 = pytest.mark.skipif(not bf16_gemm_available(), reason="no oneDNN bfloat16 GEMM on this CPU")


@needs_kernel
@pytest.mark.parametrize("shape", [(576, 960), (1537, 577), (64, 5000), (20, 4160), (3, 17)])
def test_gemv_streams_bfloat16_weights_exactly_widened(shape):
    """Each bfloat16 weight widened to fp32 exactly, the row rounded to bfloat16, the sums in fp32 and
    each output rounded to bfloat16 (oneDNN's multi-row semantics): F.linear over the same operands in
    float64, rounded, within one bfloat16 step; at band and tile edges and part-filled eight-row passes;
    the same floats at 1 and 2 threads."""
    n_in, n_out = shape
    g = torch.Generator().manual_seed(n_in)
    w = (torch.randn(n_out, n_in, generator=g) * 0.05).bfloat16()
    x = torch.randn(1, n_in, generator=g)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the bands split over two threads, whatever the session runs
        y = gemv(x, w.t().contiguous())
        torch.set_num_threads(1)
        one = gemv(x, w.t().contiguous())
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, y)
    assert y.dtype == torch.float32 and y.shape == (1, n_out)
    assert torch.equal(y, y.bfloat16().float())  # outputs are bfloat16 values
    want = F.linear(x.bfloat16().double(), w.double())
    torch.testing.assert_close(y.double(), want, rtol=2 ** -7, atol=1e-6)
    assert (y == want.bfloat16().float()).float().mean() > 0.98  # only ties of the rounding differ
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        gemv(x, w.t().contiguous().half())


def _wide() -> torch.nn.Module:
    """Two layers whose weights are all at least STREAM_MIN_ELEMENTS (hidden 512): they stream."""
    model, _ = tiny_model(seed=5, layers=2, hidden=512, heads=8, kv_heads=4)
    return model.fuse_projections().eval()


@needs_kernel
@needs_bf16
def test_install_rounds_every_weight_and_packs_bfloat16_at_every_row_count(monkeypatch):
    plain, fast = _wide(), _wide()
    assert install_cpu_linears(fast, "transposed", weights="bfloat16") == "transposed-bf16"
    layer = fast.model.layers[0]
    for w in (layer.self_attn.qkv[0], layer.self_attn.o_proj.weight, layer.mlp.gate_up,
              layer.mlp.down_proj.weight, fast.model.embed_tokens.weight):
        assert w.dtype == torch.float32 and torch.equal(w, w.bfloat16().float())  # bf16 values, fp32 tensors
    packs = [*layer.self_attn.fast.values(), *layer.mlp.fast.values(), fast.fast["head"]]
    assert all(isinstance(p, PackedLinear) and p.backend == "onednn-bf16" and p.min_rows == 1 for p in packs)
    assert all(p.packed.dtype == torch.bfloat16 for p in packs)
    streams = [p.stream for p in packs if p.weight.numel() >= STREAM_MIN_ELEMENTS]
    assert streams and all(s.dtype == torch.bfloat16 and s.is_contiguous() for s in streams)
    # the same model on plain F.linear with the rounded weights: only the rows' rounding to bfloat16
    # (multi-row products) and the output's separate them
    install_cpu_linears(plain, "plain")
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(p.bfloat16())
        plain.fuse_projections()
    import gambit.model.layers as layers_mod
    import gambit.model.llama as llama_mod

    def bf16_product(x, weight, bias=None, fast=None):  # what a bfloat16 product is, in ATen
        b = None if bias is None else bias.bfloat16()
        return F.linear(x.bfloat16(), weight.bfloat16(), b).float()

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    with one_thread(), torch.inference_mode():
        for rows in (1, 7, 40):
            ids = torch.randint(0, plain.config.vocab_size, (1, rows))
            want, have = plain.logits(plain(ids)[0]), fast.logits(fast(ids)[0])
            with monkeypatch.context() as m:
                m.setattr(layers_mod, "project", bf16_product)
                m.setattr(llama_mod, "project", bf16_product)
                emulated = plain.logits(plain(ids)[0])
            assert have.dtype == torch.float32
            # bfloat16 products round their rows and outputs (8 bits of mantissa) at every linear: the
            # logits move from fp32's as far as bfloat16 products emulated in ATen move them, no further
            assert 0 < rel(emulated, want) <= 0.05 and rel(have, want) <= 0.05
            assert rel(have, want) <= 2 * rel(emulated, want) + 1e-3
            assert (have.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85


@needs_kernel
@needs_bf16
def test_cpp_and_python_layer_loops_give_the_same_floats_with_bfloat16_weights():
    """Batch 1 (streamed bf16 copies) and batch 5 (the packs): the C++ layer loop's events equal the
    Python loop's, bit for bit, and it serves the bf16 model (one backend, the streams as its weights)."""
    model, tok = tiny_model(seed=5, layers=2, hidden=512, heads=8, kv_heads=4)
    for batch in (1, 5):
        runs = []
        for on in (False, True):
            eng = Engine(copy.deepcopy(model), tok, EngineConfig(device="cpu", cpu_layers=on,
                                                                 cpu_weights="bfloat16"))
            assert eng.cpu_linear == "transposed-bf16"
            w = cpu_decoder.layer_weights(eng.model)
            assert w is not None and w.onednn and w.stream_min == STREAM_MIN_ELEMENTS
            assert w.lw[1].dtype == torch.bfloat16  # qkv's one-row weight: its streamed bf16 copy
            for i in range(batch):
                eng.add(f"Q: {i}+4=?\nA:", SamplingParams(temperature=0.8, max_tokens=10, seed=3 + i,
                                                          logprobs=2, ignore_eos=True))
            out = []
            while eng.has_unfinished():
                out += [(ev.trace_id, getattr(ev, "token_id", None), getattr(ev, "logprob", None))
                        for ev in eng.step()]
            runs.append(out)
        assert runs[0] == runs[1] and len(runs[0]) >= 10 * batch


@needs_bf16
def test_greedy_tokens_mostly_those_of_fp32_weights():
    """Bfloat16 weights are another model's floats: greedy decoding of the shipped-size target follows
    fp32's closely but is not bound to equal it (what the engine's own paths agree on is above)."""
    model, tok = tiny_model(seed=5, layers=2, hidden=64)
    prompts = [tok.encode(p) for p in ("12+7=", "3*4-1=", "99-9=", "5*5=")]
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = {}
    with one_thread():
        for weights in ("float32", "bfloat16"):
            eng = Engine(copy.deepcopy(model), tok, EngineConfig(device="cpu", num_blocks=64,
                                                                 cpu_weights=weights))
            outs[weights] = eng.generate(prompts, greedy)
    same = sum(a == b for x, y in zip(outs["float32"], outs["bfloat16"], strict=True)
               for a, b in zip(x, y, strict=True))
    assert same >= 0.75 * 16 * len(prompts)


def test_bad_combinations_are_refused_with_what_to_do(monkeypatch):
    model, tok = tiny_model(seed=5, layers=1, hidden=64)
    with pytest.raises(ValueError, match="cpu_weights must be float32 or bfloat16"):
        EngineConfig(cpu_weights="int8")
    with pytest.raises(ValueError, match="cpu_weights=bfloat16 needs cpu_linear=transposed"):
        EngineConfig(cpu_weights="bfloat16", cpu_linear="packed")
    with pytest.raises(ValueError, match="is for an fp32 model on the CPU"):
        Engine(copy.deepcopy(model), tok,
               EngineConfig(device="cpu", dtype="bfloat16", cpu_weights="bfloat16"))
    monkeypatch.setattr(linear, "bf16_gemm_available", lambda: False)
    with pytest.raises(ValueError, match="AVX512-BF16 or AMX"):
        Engine(copy.deepcopy(model), tok, EngineConfig(device="cpu", cpu_weights="bfloat16"))
    with pytest.raises(ValueError, match="cpu_weights must be one of"):
        install_cpu_linears(copy.deepcopy(model).fuse_projections(), "transposed", weights="fp8")


@needs_kernel
@needs_bf16
def test_speculative_greedy_equals_plain_with_bfloat16_weights():
    """The shipped target and drafters with bfloat16 weights: verification's multi-row products and plain
    decoding's one-row ones agree, so EAGLE-3.1 and PR at batch 1 give plain greedy decoding's tokens."""
    from gambit.paths import TARGET
    from gambit.tasks.arithmetic import TaskConfig, generate

    eng = Engine.from_pretrained(str(TARGET), EngineConfig(model=str(TARGET), cpu_weights="bfloat16",
                                                           num_blocks=600))
    prompts = [eng.tokenizer.encode(p.prompt) for p in generate("test", 6, 0, TaskConfig(4, 8))]
    plain = eng.generate(prompts, SamplingParams(temperature=0, max_tokens=64))
    for method in ("eagle3.1", "pr"):
        d0 = eng.stats.spec_drafts
        for p, ref in zip(prompts, plain, strict=True):
            assert eng.generate([p], SamplingParams(temperature=0, max_tokens=64, decoding=method))[0] == ref
        assert eng.stats.spec_drafts > d0
