"""The C++ drafter forward (cpu_drafter) and tree drafting (cpu_tree) against the Python ones: the same
floats and cache writes, the same trees, through whole speculative generations."""

from __future__ import annotations

import pytest
import torch
from spec_util import SHIPPED, one_thread, tiny_target

from gambit.engine import Engine, EngineConfig, SamplingParams, cpu_attention, linear
from gambit.engine.config import SpecConfig
from gambit.model import load_model
from gambit.speculative import cpu_tree, random_drafter
from gambit.speculative import tree as tree_mod
from gambit.speculative.drafter import Drafter
from gambit.speculative.tree import TreeAttention
from gambit.tasks.arithmetic import TaskConfig, generate

SPECS = [SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2),
         SpecConfig(gamma=4, budget=10, grow_width=2, offer_width=4, reconsider=3),  # m > Bw
         SpecConfig(gamma=3, budget=12, grow_width=3, offer_width=3, reconsider=2, self_query=False)]


def _engine(model, tok, spec, tied: bool = False, reduced: bool = False, mlp: tuple[int, int] = ()) -> Engine:
    eng = Engine(model, tok, EngineConfig(device="cpu", dtype="float32", spec=spec, num_blocks=512))
    for i, (key, seed, method) in enumerate((("eagle", 1, "eagle3.1"), ("pr", 2, "pr"))):
        if mlp:  # MLP widths off ATen's 32-value blocks (the fused silu * up's scalar tails)
            d = random_drafter(eng.model, seed=seed, method=method, intermediate_size=mlp[i])
        elif reduced:  # a reduced draft vocabulary: 40 target ids spread over the vocabulary (d2t/t2d)
            vd = 40
            d = random_drafter(eng.model, seed=seed, method=method, draft_vocab_size=vd)
            ids = torch.linspace(0, model.config.vocab_size - 1, vd).long()
            d.d2t.copy_(ids - torch.arange(vd))
            d.t2d.zero_()
            d.t2d[ids] = True
        else:
            d = random_drafter(eng.model, seed=seed, method=method)
        if tied:  # a zero head: every row equally sure, every child equally scored (ties everywhere)
            with torch.no_grad():
                d.lm_head.weight.zero_()
        eng.register_drafter(key, d)
    return eng


def _buffers(attention):
    if type(attention) is TreeAttention:
        return [attention.k[0], attention.v[0]]
    return [attention.cache.k, attention.cache.v]


@pytest.mark.parametrize("target", ["shipped", "gqa", "tied", "reduced", "amd", "odd_mlp"])
def test_cpp_drafting_matches_python(target, monkeypatch):
    """``tied``: ties in confidence and score break the same way in both (the least-confident rows by a
    stable sort, the earlier row first); ``reduced``: a drafter over part of the vocabulary, whose draft
    ids the tree maps to target ids (d2t); ``amd``: the packing an AMD CPU gets on any machine (oneDNN
    for the larger weights, none for the o projection and head), which the C++ forward must still serve;
    ``odd_mlp``: MLP widths 40 and 17 (one 32-value block and a scalar tail, only a tail) through the
    fused forward's ``silu(gate) * up``, which must give ATen's floats."""
    if target == "amd":
        if not linear.onednn_available():
            pytest.skip("no oneDNN")
        monkeypatch.setattr(linear, "cpu_vendor", lambda: "AuthenticAMD")
    if target in ("shipped", "tied", "reduced", "amd", "odd_mlp"):
        model, tok = load_model(SHIPPED, device="cpu", dtype="float32")
    else:
        model, tok = tiny_target(seed=3, hidden=32, heads=4, kv_heads=2)
    prompts = [tok.encode(p.prompt) for p in generate("test", 3, 5, TaskConfig(2, 6))]
    seen = {"forward": 0, "tree": 0}
    py_forward, cpp_draft = Drafter.forward, cpu_tree.draft

    def forward(self, input_ids, feature, positions, attention=None, self_query=None):
        ff = self.fast_forward
        if ff is None:
            return py_forward(self, input_ids, feature, positions, attention, self_query)
        before = [b.clone() for b in _buffers(attention)]
        out = ff(input_ids, feature, positions, attention, self_query)
        if out is None:
            return py_forward(self, input_ids, feature, positions, attention, self_query)
        after = [b.clone() for b in _buffers(attention)]
        for b, x in zip(_buffers(attention), before, strict=True):
            b.copy_(x)
        self.fast_forward = None
        try:
            ref = py_forward(self, input_ids, feature, positions, attention, self_query)
        finally:
            self.fast_forward = ff
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
        assert all(torch.equal(a, b) for a, b in zip(after, _buffers(attention), strict=True))
        seen["forward"] += 1
        return out

    def draft(drafter, cfg, kc, vc, tables, ctx_len, *root):
        out = cpp_draft(drafter, cfg, kc, vc, tables, ctx_len, *root)
        S, Hkv, D = tables.shape[0], kc.shape[0], kc.shape[-1]
        ck = kc.index_select(1, tables.flatten()).view(Hkv, S, -1, D).transpose(0, 1)
        cv = vc.index_select(1, tables.flatten()).view(Hkv, S, -1, D).transpose(0, 1)
        attn = TreeAttention([ck], [cv], ctx_len, 1 + cfg.gamma * cfg.rows)
        ref = tree_mod.draft_tree(drafter, cfg, *root, attn)
        for f in ("tokens", "parent", "depth", "valid", "mask", "reconsidered", "score"):
            assert torch.equal(getattr(out, f), getattr(ref, f)), f
        seen["tree"] += 1
        return out

    monkeypatch.setattr(Drafter, "forward", forward)
    monkeypatch.setattr(cpu_tree, "draft", draft)
    with one_thread():
        for spec in SPECS:
            eng = _engine(model, tok, spec, tied=target == "tied", reduced=target == "reduced",
                          mlp=(40, 17) if target == "odd_mlp" else ())
            assert all(d.fast_forward is not None for d in eng.speculator().drafters.values())
            if target == "amd":  # mixed packing, as measured best there
                m = eng.speculator().drafters["pr"].midlayer
                assert m.mlp.fast["gate_up"].backend == "onednn" and "o" not in m.self_attn.fast
            for key in ("eagle", "pr"):
                for batch in (1, 3):
                    eng.generate(prompts[:batch], SamplingParams(temperature=0, max_tokens=24, decoding=key))
    assert seen["forward"] > 50 and seen["tree"] > 20


def test_fused_silu_serves_where_aten_runs_avx512():
    """Where ATen's CPU kernels are AVX512 ones, the fused forward's ``silu(gate) * up`` matched ATen's
    floats on its probe and serves (elsewhere it stays off and ATen's silu and mul run)."""
    k = cpu_attention.kernel()
    if k is None:
        pytest.skip("no C++ kernels here")
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        pytest.skip(f"ATen runs its {torch.backends.cpu.get_cpu_capability()} kernels here")
    assert k.fused_silu_exact()


def test_stale_weights_fall_back_to_python():
    model, tok = load_model(SHIPPED, device="cpu", dtype="float32")
    eng = _engine(model, tok, SPECS[0])
    d = eng.speculator().drafters["pr"]
    with torch.inference_mode():
        assert d.fast_forward is not None and d.fast_forward.usable()
    with torch.no_grad():
        d.midlayer.mlp.gate_up.mul_(1.0)  # modified in place: the packed copies are stale
    with torch.inference_mode():
        assert not d.fast_forward.usable()


def test_cpp_tree_leaves_the_cached_layout_alone():
    """At batch 1 ``expand().contiguous()`` of the cached layout is the layout itself: the C++ tree once
    wrote its corrected tokens' rows into it, so every later tree (C++ or Python) of that configuration
    read them as feature rows. The layout must not change, and a batch-1 run must give the trees the
    Python loop gives."""
    model, tok = load_model(SHIPPED, device="cpu", dtype="float32")
    prompts = [tok.encode(p.prompt) for p in generate("test", 2, 9, TaskConfig(4, 6))]
    spec = SpecConfig(gamma=4, budget=16, grow_width=3, offer_width=3, reconsider=2)
    outs = {}
    with one_thread():
        for use_cpp in (True, False):
            tree_mod._LAYOUTS.clear()
            eng = _engine(model, tok, spec)
            if not use_cpp:
                for d in eng.speculator().drafters.values():
                    d.fast_forward = None
            params = SamplingParams(temperature=0, max_tokens=32, decoding="pr")
            cfg = eng.speculator().tree_config("pr")
            tree_mod._layout(cfg, cfg.grow_width, cfg.reconsider, torch.device("cpu"))  # what trees reuse
            before = {k: [t.clone() for t in (v.feat_row, v.depth, v.is_rec)]
                      for k, v in tree_mod._LAYOUTS.items()}
            res = [eng.generate([p], params)[0] for p in prompts]  # batch 1, one after the other
            after = {k: [v.feat_row, v.depth, v.is_rec] for k, v in tree_mod._LAYOUTS.items()}
            assert before.keys() == after.keys() and before
            for k in before:
                assert all(torch.equal(a, b) for a, b in zip(before[k], after[k], strict=True)), k
            outs[use_cpp] = (res, eng.stats.spec_drafts, eng.stats.spec_accepted)
    assert outs[True] == outs[False]  # the same tokens and the same cycles and accepted counts
