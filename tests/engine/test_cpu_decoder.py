"""The C++ layer loop (gambit/engine/cpu_decoder.py) computes bit-identical floats to the Python one.

Every forward the CPU attention kernels serve (decode rows, small trees and chunks) runs through it
by default, so the shipped drafters' and scorers' reproducibility cards depend on that equality.
"""

from __future__ import annotations

import pytest
import torch
from engine_util import SHIPPED

from gambit.engine import (
    BoundaryEvent,
    Engine,
    EngineConfig,
    SamplingParams,
    TokenEvent,
    cpu_attention,
    cpu_decoder,
)
from gambit.engine.attention import SeqInput
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative import random_drafter

pytestmark = pytest.mark.skipif(cpu_attention.kernel() is None, reason="needs the compiled CPU kernels")


def _events(eng: Engine, jobs: list[tuple[str, SamplingParams]], fork_at: int = 3) -> list[tuple]:
    """Run ``jobs``, forking the first trace after ``fork_at`` steps; every event as exact values."""
    ids = [eng.add(p, sp) for p, sp in jobs]
    out, step = [], 0
    while eng.has_unfinished():
        if step == fork_at:
            eng.fork(ids[0], 2, seeds=[7, 8])
        for ev in eng.step():
            if isinstance(ev, TokenEvent):
                out.append(("tok", ev.trace_id, ev.token_id, ev.logprob, ev.top_logprobs))
            elif isinstance(ev, BoundaryEvent):
                out.append(("bnd", ev.trace_id, ev.position, ev.hidden.tolist()))
            else:
                out.append((type(ev).__name__, ev.trace_id, tuple(ev.output_ids)))
        step += 1
    return out


def _count_calls(monkeypatch) -> list[int]:
    calls = [0, 0, 0]  # forwards per attention mode: decode rows, any rows (kernel), SDPA groups
    real = cpu_decoder.forward

    def counted(model, weights, ids, positions, attn, taps=()):
        calls[cpu_decoder._meta(attn)[0]] += 1
        return real(model, weights, ids, positions, attn, taps)

    monkeypatch.setattr(cpu_decoder, "forward", counted)
    return calls


@pytest.fixture(scope="module")
def target():
    return load_model(SHIPPED, device="cpu", dtype="float32")


JOBS = [(p, SamplingParams(temperature=t, max_tokens=20, seed=i, logprobs=3))
        for i, (p, t) in enumerate([("Q: 3+4*2=?\nA:", 0.0), ("Q: 9-5=?\nA:", 0.8), ("12", 1.0),
                                    ("Q: (2+3)*4=?\nA:", 0.0), ("7*", 0.7), ("Q: 1+1=?\nA:", 1.2),
                                    ("5", 0.0), ("Q: 8/2+6=?\nA:", 0.9)])]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("cpu_linear", ["transposed", "packed"])
def test_plain_decoding_is_bit_identical(target, monkeypatch, batch, cpu_linear):
    model, tok = target
    calls = _count_calls(monkeypatch)
    runs = [_events(Engine(model, tok, EngineConfig(device="cpu", cpu_linear=cpu_linear, cpu_layers=on)),
                    JOBS[:batch]) for on in (False, True)]
    assert calls[0] > 10 and calls[2] >= 1  # the decode steps and the prompts' prefill went through C++
    assert runs[1] == runs[0]


@pytest.mark.parametrize("rows", ["kernel", "sdpa"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("method", ["eagle", "pr"])
def test_speculative_decoding_is_bit_identical(target, monkeypatch, method, batch, rows):
    """Tree verification forwards (masks, taps for the drafter's features) through the C++ loop, with
    the trees' rows in the kernel (the default) or, switched off, in SDPA groups."""
    model, tok = target
    if rows == "sdpa":
        monkeypatch.setattr("gambit.engine.attention.SPECULATIVE_ROWS_IN_KERNEL", False)
    spec = SpecConfig(gamma=3, budget=10, grow_width=3, offer_width=3, reconsider=2 if method == "pr" else 0)
    calls = _count_calls(monkeypatch)
    runs = []
    for on in (False, True):
        eng = Engine(model, tok, EngineConfig(device="cpu", spec=spec, num_blocks=256, cpu_layers=on))
        eng.register_drafter("d", random_drafter(eng.model, seed=1))
        jobs = [(p, SamplingParams(temperature=sp.temperature, max_tokens=24, seed=sp.seed, decoding="d",
                                       ignore_eos=True))
                for p, sp in JOBS[:batch]]
        runs.append(_events(eng, jobs, fork_at=10))
    if batch == 1 or rows == "kernel":
        assert calls[1] > 5  # one trace's tree (≤ 12 tokens), or several trees: the kernel
    else:
        assert calls[2] > 5  # several trees above the row limit: SDPA groups
    assert runs[1] == runs[0]


def test_models_with_biases_keep_the_python_loop(target):
    model, tok = target
    eng = Engine(model, tok, EngineConfig(device="cpu"))
    assert cpu_decoder.layer_weights(eng.model) is not None
    eng.model.config.attention_bias = True  # q/k/v/o biases: the C++ loop has no bias terms
    try:
        assert cpu_decoder.layer_weights(eng.model) is None
    finally:
        eng.model.config.attention_bias = False


def test_layer_taps_match_the_python_forward(target):
    """Taps (the EAGLE-3 features and the scorer's state) equal the Python forward's."""
    model, tok = target
    eng = Engine(model, tok, EngineConfig(device="cpu"))
    eng.add("Q: 2+2=?\nA:", SamplingParams(temperature=0.0, max_tokens=8))
    eng.step()
    trace = next(iter(eng.traces.values()))
    taps = (*eng.model.eagle_taps, eng.model.config.num_hidden_layers)
    # one decode forward each way over the same cached prefix (the KV write is idempotent)
    item = SeqInput([trace.token_ids[-1]], [trace.num_cached], trace.num_cached, list(trace.block_table))
    res = []
    for on in (False, True):
        eng.runner.cpp_layers = on
        r = eng.runner.forward([item], [0], taps=taps)
        res.append((r.logits, r.hidden, r.taps))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    assert sorted(res[0][2]) == sorted(res[1][2]) == sorted(taps)
    for t in taps:
        assert torch.equal(res[0][2][t], res[1][2][t])


@pytest.mark.parametrize("width", [8, 17, 64, 192, 576, 960, 2048, 8192])
def test_aten_order_rms_norm_is_torchs(width):
    """The loop's RMSNorm (ATen's pow / cascade sum / div / add / rsqrt / mul order, no ATen calls) gives
    ``torch.rms_norm``'s floats at every width, row count and magnitude; where ATen's kernels sum in
    8-float lanes (x86) its probe passes, so it serves (elsewhere it may call ATen and stay equal)."""
    import platform

    k = cpu_attention.kernel()
    if platform.machine() in ("x86_64", "AMD64"):
        assert k.aten_rms_norm_exact(width, 1e-6)
    g = torch.Generator().manual_seed(width)
    w = torch.randn(width, generator=g)
    for rows in (1, 7, 49):
        for scale in (1e-3, 1.0, 60.0):
            x = torch.randn(rows, width, generator=g) * torch.rand(rows, 1, generator=g) * scale
            for eps in (1e-6, 1e-5):
                assert torch.equal(k.aten_rms_norm(x, w, eps), torch.rms_norm(x, [width], w, eps))
    assert not k.aten_rms_norm_exact(4, 1e-6)  # under one 8-float lane ATen sums otherwise: not served
