"""The EAGLE-3.1 drafter: shapes, taps, self-query, and checkpoints in the public EAGLE-3 layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from gambit.model.llama import eagle_taps
from gambit.speculative import Drafter, DrafterConfig, load_drafter, random_drafter, save_drafter

PUBLIC_KEYS = {"fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight",
               "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
               "midlayer.post_attention_layernorm.weight", "midlayer.self_attn.q_proj.weight",
               "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
               "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight",
               "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight",
               "lm_head.weight", "d2t", "t2d"}


def _inputs(model, B=2, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    taps = torch.randn(B, T, 3 * model.config.hidden_size, generator=g)
    pos = torch.arange(T).expand(B, T)
    return ids, taps, pos


def test_taps_distinct_and_eagle_rule_kept():
    assert eagle_taps(6) == (1, 3, 5)  # the rule gives (2, 3, 3): collapsed, so spread instead
    assert eagle_taps(32) == (2, 16, 29)  # Llama-3.1-8B: the EAGLE-3 rule
    for L in range(3, 80):
        taps = eagle_taps(L)
        assert len(set(taps)) == 3 and all(0 <= i < L for i in taps) and list(taps) == sorted(taps)
    with pytest.raises(ValueError, match="three distinct"):
        eagle_taps(2)


def test_config_validation(tiny):
    model, _ = tiny
    cfg = DrafterConfig.for_target(model.config)
    assert cfg.target_taps == (1, 3, 5) and cfg.hidden_size == 32
    with pytest.raises(ValueError, match="target_taps"):
        DrafterConfig.for_target(model.config, target_taps=(1, 3, 3))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        DrafterConfig.for_target(model.config, draft_vocab_size=10_000)
    with pytest.raises(ValueError, match="num_layers"):
        DrafterConfig.for_target(model.config, num_layers=0)


@pytest.mark.parametrize("layers,vd", [(1, None), (2, 40)])
def test_shapes_and_keys(tiny, layers, vd):
    model, _ = tiny
    d = random_drafter(model, num_layers=layers, draft_vocab_size=vd or model.config.vocab_size)
    ids, taps, pos = _inputs(model)
    feat = d.fuse(taps)
    assert feat.shape == (2, 7, 32)
    logits, nxt = d(ids, feat, pos)
    assert logits.shape == (2, 7, vd or model.config.vocab_size) and nxt.shape == (2, 7, 32)
    keys = set(d.state_dict())
    assert PUBLIC_KEYS <= keys and "embed_tokens.weight" not in keys
    assert d.midlayer.self_attn.q_proj.weight.shape == (32, 64)  # q/k/v read [emb, feature]: 2H
    assert (layers == 2) == any(k.startswith("extra_layers.0.") for k in keys)
    # post-norm output is the next feature (norm_output): unit RMS up to the norm weight
    rms = (nxt / d.norm.weight).pow(2).mean(-1)
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-4, atol=1e-4)
    full = d.logits_to_target(logits)
    assert full.shape[-1] == model.config.vocab_size


def test_causal_rows_and_self_query(tiny):
    """Rows see only earlier rows; self_query changes exactly the flagged rows' outputs."""
    model, _ = tiny
    d = random_drafter(model)
    ids, taps, pos = _inputs(model, B=1, T=6)
    feat = d.fuse(taps)
    with torch.no_grad():
        full, _ = d(ids, feat, pos)
        part, _ = d(ids[:, :4], feat[:, :4], pos[:, :4])
        torch.testing.assert_close(full[:, :4], part)
        sq = torch.zeros(1, 6, dtype=torch.bool)
        sq[0, 2] = True
        flagged, _ = d(ids, feat, pos, self_query=sq)
    changed = (flagged - full).abs().amax(-1)[0]
    assert changed[2] > 1e-4
    # keys/values stay those of [emb, feature]: every other row is unchanged
    assert torch.allclose(flagged[0, [0, 1, 3, 4, 5]], full[0, [0, 1, 3, 4, 5]], atol=1e-6)


def test_save_load_round_trip(tiny, tmp_path):
    model, _ = tiny
    d = random_drafter(model, seed=3, draft_vocab_size=50)
    d.d2t.copy_(torch.arange(50) % 3)  # a non-trivial draft → target map
    d.t2d.zero_()
    d.t2d[d.to_target(torch.arange(50))] = True
    save_drafter(d, tmp_path / "dr", extra_card="trained on nothing")
    assert set(load_file(str(tmp_path / "dr" / "model.safetensors"))) == PUBLIC_KEYS
    cfg = json.loads((tmp_path / "dr" / "config.json").read_text())
    assert cfg["target_taps"] == [1, 3, 5] and cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
    assert "trained on nothing" in (tmp_path / "dr" / "README.md").read_text()
    back = load_drafter(tmp_path / "dr", model)
    assert back.config == d.config
    for k, v in d.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    ids, taps, pos = _inputs(model)
    with torch.no_grad():
        a = d(ids, d.fuse(taps), pos)
        b = back(ids, back.fuse(taps), pos)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert back.embed_tokens is model.model.embed_tokens


def test_public_eagle3_checkpoint_loads(tiny, tmp_path):
    """A published-style folder: EAGLE-3 config (no taps, no fc_norm), ``model.`` prefixes, embedding."""
    model, _ = tiny
    ref = random_drafter(model, seed=5, fc_norm=False, norm_output=False, draft_vocab_size=60)
    state = {("model." + k if k.startswith("mid") else k): v for k, v in ref.state_dict().items()}
    state["embed_tokens.weight"] = model.model.embed_tokens.weight.detach().clone()
    folder = tmp_path / "public"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 100,
        "draft_vocab_size": 60, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 512}))
    d = load_drafter(folder, model)
    assert not d.config.fc_norm and not d.config.norm_output
    assert d.config.target_taps == eagle_taps(6) and d.config.head_dim == 8
    ids, taps, pos = _inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(d(ids, d.fuse(taps), pos), ref(ids, ref.fuse(taps), pos))


@pytest.mark.parametrize("key", ["midlayer.self_attn.q_proj.weight", "fc_norm.1.weight", "d2t"])
def test_missing_or_misshapen_tensor_refused(tiny, tmp_path, key):
    model, _ = tiny
    save_drafter(random_drafter(model), tmp_path / "dr")
    path = tmp_path / "dr" / "model.safetensors"
    state = load_file(str(path))
    good = dict(state)
    del state[key]
    save_file(state, str(path))
    with pytest.raises(ValueError, match=f"lacks.*{key}"):
        load_drafter(tmp_path / "dr", model)
    good[key] = torch.zeros(3, 3) if key != "d2t" else torch.zeros(7, dtype=torch.long)
    save_file(good, str(path))
    with pytest.raises(ValueError, match=f"tensor {key} has shape"):
        load_drafter(tmp_path / "dr", model)


def test_bad_folders(tiny, tmp_path):
    model, _ = tiny
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_drafter(tmp_path / "nothing", model)
    save_drafter(random_drafter(model), tmp_path / "dr")
    cfg = json.loads((tmp_path / "dr" / "config.json").read_text())
    (tmp_path / "dr" / "config.json").write_text(json.dumps({**cfg, "target_taps": [1, 3, 9]}))
    with pytest.raises(ValueError, match="outside the target"):
        load_drafter(tmp_path / "dr", model)
    (tmp_path / "dr" / "config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    with pytest.raises(ValueError, match="does not fit the target"):
        load_drafter(tmp_path / "dr", model)
    assert isinstance(random_drafter(model), Drafter)


def test_fused_projections_change_nothing(tiny):
    model, _ = tiny
    d = random_drafter(model, seed=9, num_layers=2)
    ids, taps, pos = _inputs(model)
    sq = torch.zeros(2, 7, dtype=torch.bool)
    sq[:, 3] = True
    with torch.no_grad():
        before = [d(ids, d.fuse(taps), pos, self_query=q) for q in (None, sq)]
        for layer in (d.midlayer, *d.extra_layers):
            layer.self_attn.fuse()
            layer.mlp.fuse()
        after = [d(ids, d.fuse(taps), pos, self_query=q) for q in (None, sq)]
    for a, b in zip(before, after, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
