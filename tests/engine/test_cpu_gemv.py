"""The streaming one-row kernel (gambit/engine/cpu_gemv.py) and where the engine uses it."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from engine_util import one_thread, tiny_model

from gambit.engine import Engine, EngineConfig, SamplingParams, cpu_attention, cpu_decoder
from gambit.engine.cpu_gemv import gemv
from gambit.engine.linear import STREAM_MIN_ELEMENTS, PackedLinear, install_cpu_linears

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")


@pytest.mark.parametrize("shape", [(576, 960), (1537, 577), (64, 5000), (3, 17)])
def test_gemv_computes_f_linear(shape):
    """Band and tile edges: inputs not a multiple of 4, outputs not of the vector width or past a tile."""
    n_in, n_out = shape
    g = torch.Generator().manual_seed(n_in)
    w = torch.randn(n_out, n_in, generator=g) * 0.05
    x = torch.randn(1, 1, n_in, generator=g)
    y = gemv(x, w.t().contiguous())
    assert y.shape == (1, 1, n_out)
    torch.testing.assert_close(y, F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=1e-5)


def test_gemv_floats_do_not_depend_on_the_thread_count():
    w = torch.randn(960, 576) * 0.05
    x = torch.randn(1, 576)
    wt = w.t().contiguous()
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemv(x, wt)
        torch.set_num_threads(2)
        two = gemv(x, wt)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, two)


def test_gemv_refuses_wrong_shapes():
    wt = torch.randn(64, 32)
    with pytest.raises(RuntimeError, match="one row"):
        gemv(torch.randn(2, 64), wt)
    with pytest.raises(RuntimeError, match="wt"):
        gemv(torch.randn(1, 32), wt.t())  # not contiguous
    with pytest.raises(ValueError, match="stream"):
        PackedLinear(wt.t(), None, 2, stream=wt.t())


def _wide() -> torch.nn.Module:
    """Two layers whose weights are all at least STREAM_MIN_ELEMENTS (hidden 512)."""
    model, _ = tiny_model(seed=5, layers=2, hidden=512, heads=8, kv_heads=4)
    return model.fuse_projections().eval()


def test_large_weights_stream_one_row_and_keep_the_model():
    plain = _wide()
    fast = copy.deepcopy(plain)
    install_cpu_linears(plain, "plain")
    install_cpu_linears(fast, "transposed")
    attn, mlp = fast.model.layers[0].self_attn, fast.model.layers[0].mlp
    assert attn.qkv[0].numel() >= STREAM_MIN_ELEMENTS and attn.fast["qkv"].stream is not None
    assert mlp.fast["gate_up"].stream is not None and mlp.fast["down"].stream is not None
    # a 100-token head is small: a packed GEMM (MKL) or, on AMD, F.linear on its transposed copy
    assert getattr(fast.fast["head"], "stream", None) is None
    with one_thread(), torch.inference_mode():
        for rows in (1, 7):
            ids = torch.randint(0, plain.config.vocab_size, (1, rows))
            torch.testing.assert_close(fast.logits(fast(ids)[0]), plain.logits(plain(ids)[0]), rtol=1e-4,
                                       atol=1e-4)
    off = copy.deepcopy(plain)
    install_cpu_linears(off, "transposed", stream=False)
    assert off.model.layers[0].mlp.fast["gate_up"].stream is None


def test_shipped_size_weights_never_stream():
    model, _ = tiny_model(seed=1, layers=1, hidden=192, heads=4, kv_heads=2)  # 192 x 384: below the bar
    model = model.fuse_projections().eval()
    install_cpu_linears(model, "transposed")
    packs = [*model.model.layers[0].self_attn.fast.values(), *model.model.layers[0].mlp.fast.values()]
    assert packs and all(p.stream is None for p in packs)


def test_cpp_and_python_layer_loops_stream_the_same_floats():
    """Batch-1 decode of a model with large weights: the C++ loop's gemv calls equal the Python ones."""
    model, tok = tiny_model(seed=5, layers=2, hidden=512, heads=8, kv_heads=4)
    runs = []
    for on in (False, True):
        eng = Engine(model, tok, EngineConfig(device="cpu", cpu_layers=on))
        w = cpu_decoder.layer_weights(eng.model)
        assert w is not None and w.stream_min == STREAM_MIN_ELEMENTS
        eng.add("Q: 3+4=?\nA:", SamplingParams(temperature=0.8, max_tokens=12, seed=3, logprobs=2,
                                                ignore_eos=True))
        out = []
        while eng.has_unfinished():
            out += [(getattr(ev, "token_id", None), getattr(ev, "logprob", None)) for ev in eng.step()]
        runs.append(out)
    assert runs[0] == runs[1] and len(runs[0]) >= 12


def test_streamed_models_norm_in_one_kernel_call_until_cleared():
    from gambit.engine.linear import clear_fast_paths

    model = _wide()
    install_cpu_linears(model, "transposed")
    assert model.model.norm.fast is cpu_attention.rms_norm
    assert model.model.layers[1].post_attention_layernorm.fast is cpu_attention.rms_norm
    clear_fast_paths(model)
    assert model.model.norm.fast is None
    install_cpu_linears(model, "transposed", stream=False)
    assert model.model.norm.fast is None


def test_engine_switch_turns_streaming_off():
    model, tok = tiny_model(seed=5, layers=1, hidden=512, heads=8, kv_heads=4)
    on = Engine(model, tok, EngineConfig(device="cpu"))
    assert on.model.model.layers[0].mlp.fast["down"].stream is not None
    off = Engine(model, tok, EngineConfig(device="cpu", cpu_stream=False))
    assert off.model.model.layers[0].mlp.fast["down"].stream is None
