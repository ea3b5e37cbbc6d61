"""CPU linear layouts (gambit/engine/linear.py): every mode computes the same model."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_util import one_thread, tiny_model

from gambit.engine import Engine, EngineConfig, SamplingParams
from gambit.engine.linear import PackedLinear, install_cpu_linears, mkl_available


def _fused(tie: bool) -> torch.nn.Module:
    model, _ = tiny_model(seed=3, layers=2, hidden=64, heads=4, kv_heads=2)
    if not tie:  # an untied copy of the same model, with its own head
        model.config.tie_word_embeddings = False
        model.lm_head = torch.nn.Linear(64, model.config.vocab_size, bias=False)
        with torch.no_grad():
            model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.1)
    return model.fuse_projections().eval()


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("mode", ["transposed", "packed"])
def test_modes_compute_the_plain_model(tie, mode):
    plain = _fused(tie)
    fast = copy.deepcopy(plain)
    assert install_cpu_linears(plain, "plain") == "plain"
    got = install_cpu_linears(fast, mode)
    assert got == (mode if mode == "transposed" or mkl_available() else "plain")
    with one_thread(), torch.inference_mode():
        for rows in (1, 5, 33, 64):  # below, inside and above the packed range of "transposed"
            ids = torch.randint(0, plain.config.vocab_size, (1, rows))
            want = plain.logits(plain(ids)[0])
            have = fast.logits(fast(ids)[0])
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)


def test_transposed_layout_keeps_values_and_views():
    model = _fused(tie=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    install_cpu_linears(model, "transposed")
    layer = model.model.layers[0]
    w = layer.self_attn.qkv[0]
    assert w.stride() == (1, w.shape[0])  # stored as its contiguous transpose
    assert layer.self_attn.q_proj.weight.data_ptr() == w.data_ptr()  # q/k/v still views of the fused one
    assert layer.mlp.gate_proj.weight.data_ptr() == layer.mlp.gate_up.data_ptr()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    install_cpu_linears(model, "plain")  # and back to row-major
    assert layer.self_attn.qkv[0].is_contiguous() and layer.mlp.down_proj.weight.is_contiguous()


@pytest.mark.skipif(not mkl_available(), reason="needs MKL")
def test_packed_linear_serves_only_its_row_range():
    w, b = torch.randn(8, 16), torch.randn(8)
    calls = []

    def fallback(x):
        calls.append(x.shape[0])
        return torch.nn.functional.linear(x, w, b)

    lin = PackedLinear(w, b, 2, 4, fallback=fallback)
    for rows in (1, 2, 4, 5):
        x = torch.randn(rows, 16)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert calls == [1, 5]
    with torch.no_grad():
        w.mul_(2)  # modified in place: the stale packed copy steps aside
    x = torch.randn(3, 16)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("vendor", ["", "AuthenticAMD"])
def test_engine_modes_generate_the_same_greedy_tokens(vendor, monkeypatch):
    """``AuthenticAMD``: that CPU's mixed packing (oneDNN for the larger weights, none for o), which the
    C++ layer loop serves, on any machine."""
    from gambit.engine import linear

    if vendor:
        if not linear.onednn_available():
            pytest.skip("no oneDNN")
        monkeypatch.setattr(linear, "cpu_vendor", lambda: vendor)
        monkeypatch.setattr(linear, "ONEDNN_MIN_ELEMENTS", 64 * 128)  # this model's qkv and MLP, not o
    model, tok = tiny_model(seed=5, layers=2, hidden=64)
    prompts = [tok.encode(p) for p in ("12+7=", "3*4-1=", "99-9=")]
    outs, greedy = {}, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with one_thread():
        for mode in ("plain", "packed", "transposed"):
            cfg = EngineConfig(device="cpu", num_blocks=64, cpu_linear=mode)
            eng = Engine(copy.deepcopy(model), tok, cfg)
            outs[mode] = eng.generate(prompts, greedy)
            if vendor and mode == "transposed":
                assert eng.runner._layer_weights().onednn  # the C++ loop, oneDNN packs beside none
    assert outs["packed"] == outs["plain"] == outs["transposed"]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="cpu_linear"):
        EngineConfig(cpu_linear="fast")
    with pytest.raises(ValueError, match="cpu_linear"):
        install_cpu_linears(_fused(True), "fast")


@pytest.mark.parametrize("backend", ["mkl", "onednn"])
def test_packed_backends_compute_f_linear(backend):
    from gambit.engine.linear import onednn_available

    if backend == "onednn" and not onednn_available() or backend == "mkl" and not mkl_available():
        pytest.skip(f"no {backend}")
    w = torch.randn(96, 64) * 0.1
    lin = PackedLinear(w, None, 2, backend=backend)
    with one_thread(), torch.inference_mode():
        for rows in (1, 2, 16, 70):
            x = torch.randn(1, rows, 64)
            torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="backend"):
        PackedLinear(w, None, 2, backend="cublas")


def test_gemm_vendor_pins_the_packing_choice(monkeypatch):
    """``GAMBIT_GEMM_VENDOR`` (training's compatible mode sets it) overrides this CPU's vendor, so the
    engine takes one GEMM per weight whatever CPU writes the training data."""
    from gambit.engine import linear

    large = torch.empty(192, 1024)
    monkeypatch.setattr(linear, "cpu_vendor", lambda: "GenuineIntel")
    monkeypatch.delenv("GAMBIT_GEMM_VENDOR", raising=False)
    assert linear.gemm_vendor() == "GenuineIntel" and linear.packing_backend(large) == "mkl"
    monkeypatch.setenv("GAMBIT_GEMM_VENDOR", "AuthenticAMD")
    assert linear.gemm_vendor() == "AuthenticAMD"
    if linear.onednn_available():
        assert linear.packing_backend(large) == "onednn"


def test_onednn_serves_amd_from_two_rows(monkeypatch):
    from gambit.engine import linear

    large, small = torch.empty(192, 1024), torch.empty(192, 192)  # the shipped target's gate_up and o
    assert [linear.packing_backend(w, "GenuineIntel") for w in (large, small)] == ["mkl", "mkl"]
    if not linear.onednn_available() or not mkl_available():
        pytest.skip("no oneDNN / MKL")
    assert linear.packing_backend(large, "AuthenticAMD") == "onednn"
    assert linear.packing_backend(small, "AuthenticAMD") == ""  # F.linear on the transposed layout
    plain, fast = _fused(True), _fused(True)
    install_cpu_linears(plain, "plain")
    monkeypatch.setattr(linear, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(linear, "ONEDNN_MIN_ELEMENTS", 64 * 128)  # this model's qkv and MLP, not its o
    install_cpu_linears(fast, "transposed")
    attn, mlp = fast.model.layers[0].self_attn, fast.model.layers[0].mlp
    assert (attn.fast["qkv"].backend, attn.fast["qkv"].min_rows) == ("onednn", linear.ONEDNN_MIN_ROWS)
    assert mlp.fast["down"].backend == "onednn" and "o" not in attn.fast
    with one_thread(), torch.inference_mode():
        for rows in (1, 2, 9, 70):  # one row: F.linear on the transposed layout; then oneDNN
            ids = torch.randint(0, plain.config.vocab_size, (1, rows))
            pos = torch.arange(rows)[None]
            torch.testing.assert_close(fast(ids, pos)[0], plain(ids, pos)[0], rtol=1e-4, atol=1e-4)


def test_bfloat16_cpu_model_gets_packed_bf16_linears_computing_its_plain_model():
    """A bfloat16 CPU model (``EngineConfig(dtype="bfloat16")``): every linear a oneDNN-packed bfloat16
    weight (``F.linear`` would reorder it on every call), computing what the plain bf16 model does; a
    weight changed in place afterwards steps aside to ``F.linear``."""
    from gambit.engine.linear import bf16_gemm_available

    plain = _fused(True).to(torch.bfloat16).fuse_projections()  # re-fused: .to() leaves the fused copies
    fast = copy.deepcopy(plain)
    assert install_cpu_linears(plain, "plain") == "plain"
    got = install_cpu_linears(fast, "transposed")
    if not bf16_gemm_available():
        assert got == "plain"
        pytest.skip("no oneDNN bfloat16 GEMM on this CPU")
    assert got == "onednn-bf16"
    packs = [*fast.fast.values(), *(f for layer in fast.model.layers
                                    for f in (*layer.self_attn.fast.values(), *layer.mlp.fast.values()))]
    assert len(packs) == 1 + 4 * len(fast.model.layers)
    assert all(isinstance(p, PackedLinear) and p.backend == "onednn" and p.min_rows == 1
               and p.packed.dtype == torch.bfloat16 for p in packs)
    with one_thread(), torch.inference_mode():
        for rows in (1, 5, 64):
            ids = torch.randint(0, plain.config.vocab_size, (1, rows))
            want = plain.logits(plain(ids)[0]).float()
            have = fast.logits(fast(ids)[0]).float()
            torch.testing.assert_close(have, want, rtol=2e-2, atol=2e-2)
        lin = fast.model.layers[0].mlp.fast["down"]
        x = torch.randn(3, lin.weight.shape[1], dtype=torch.bfloat16)
        lin.weight.mul_(2)  # in place after packing: the pack is stale, F.linear serves
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight))


def test_bfloat16_engine_generates_greedily_on_the_packed_path():
    """The engine in bfloat16 on the CPU: its greedy tokens with the packed bf16 linears equal those of
    the same engine on plain ``F.linear`` (``cpu_linear="plain"``)."""
    model, tok = tiny_model(seed=5, layers=2, hidden=64)
    prompts = [tok.encode(p) for p in ("12+7=", "3*4-1=", "99-9=")]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = {}
    with one_thread():
        for mode in ("plain", "transposed"):
            cfg = EngineConfig(device="cpu", dtype="bfloat16", num_blocks=64, cpu_linear=mode)
            eng = Engine(copy.deepcopy(model), tok, cfg)
            assert eng.cpu_linear in (("plain",) if mode == "plain" else ("onednn-bf16", "plain"))
            outs[mode] = eng.generate(prompts, greedy)
    assert outs["transposed"] == outs["plain"]
