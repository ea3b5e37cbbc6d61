"""Drafter training pieces: config validation, PR row selection, the losses."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gambit.train.drafter import TrainDrafterConfig, make_reconsider
from gambit.train.ttt import fresh_ce, soft_ce, topk_ce


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="method"):
        TrainDrafterConfig(method="medusa")
    with pytest.raises(ValueError, match="reconsider_frac"):
        TrainDrafterConfig(method="pr", reconsider_frac=0.9)
    with pytest.raises(ValueError, match="threads"):
        TrainDrafterConfig(threads=0)
    with pytest.raises(ValueError, match="reconsider_loss"):
        TrainDrafterConfig(method="pr", reconsider_loss="kl")
    with pytest.raises(ValueError, match="fresh_k"):
        TrainDrafterConfig(method="pr", reconsider_loss="fresh", fresh_k=0)
    assert TrainDrafterConfig(method="hass+pr").out.endswith("drafter-hass-pr")



@pytest.mark.parametrize("field, value", [
    ("grad_clip", float("nan")), ("grad_clip", -1.0), ("grad_clip", 0.0), ("min_lr_ratio", 5.0),
    ("min_lr_ratio", float("nan")), ("warmup", -3), ("weight_decay", -1.0), ("weight_decay", float("nan")),
    ("weight_decay", float("inf")), ("lr", float("inf")), ("eval_every", 0), ("num_layers", 0),
    ("n_train", 0), ("n_heldout", 0), ("data_max_tokens", 0), ("data_temperature", -1.0),
    ("draft_vocab", -1), ("init", "/nonexistent")])
def test_bad_training_values_are_refused_before_the_data_phase(field, value):
    """Refused when the config is built, not after minutes of data generation (or as a nan loss)."""
    with pytest.raises(ValueError, match=rf"{field}.*{value!r}"):
        TrainDrafterConfig(**{field: value})
    TrainDrafterConfig()  # the defaults (the shipped cards') still construct
    TrainDrafterConfig(warmup=0, weight_decay=0.0, min_lr_ratio=1.0, eval_every=1)  # the edges


def test_init_must_be_a_drafter_folder(tmp_path):
    from gambit.paths import ASSETS

    with pytest.raises(ValueError, match="init.*no config.json"):
        TrainDrafterConfig(method="pr", init=str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="init.*safetensors"):
        TrainDrafterConfig(method="pr", init=str(tmp_path))
    assert TrainDrafterConfig(method="pr", init=str(ASSETS / "drafter-eagle3.1")).init

@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_pr_selects_least_confident_rows_and_a_balance_set(beta):
    cfg = TrainDrafterConfig(method="pr", beta=beta, reconsider_frac=0.25)
    select = make_reconsider(cfg, torch.Generator().manual_seed(0))
    logits = torch.zeros(2, 8, 5)
    conf = torch.arange(16, dtype=torch.float).view(2, 8)  # larger = more confident
    logits[..., 0] = conf
    valid = torch.ones(2, 8, dtype=torch.bool)
    valid[0, 0] = False  # the least confident row is not valid: never picked
    b, r, sq = select(0, logits, valid)
    n = select.n_low
    assert n == 3 and sq is True
    assert sorted(zip(b[:n].tolist(), r[:n].tolist(), strict=True)) == [(0, 1), (0, 2), (0, 3)]
    rest = set(zip(b[n:].tolist(), r[n:].tolist(), strict=True))
    assert len(rest) == (n if beta > 0 else 0) and not rest & {(0, 0), (0, 1), (0, 2), (0, 3)}


def test_losses_against_direct_formulas():
    p_logits, q_logits = torch.randn(4, 7), torch.randn(4, 7)
    p, logq = p_logits.softmax(-1), q_logits.log_softmax(-1)
    torch.testing.assert_close(soft_ce(p_logits, q_logits), -(p * logq).sum(-1))
    top = p.topk(2, dim=-1).indices
    ref = -torch.stack([sum(p[i, v] * logq[i, v] for v in top[i]) for i in range(4)])
    torch.testing.assert_close(topk_ce(p_logits, q_logits, 2), ref)
    assert torch.all(soft_ce(p_logits, p_logits) <= soft_ce(p_logits, q_logits) + 1e-6)  # Gibbs


def test_fresh_loss_counts_only_the_tokens_not_offered():
    """FreshCE(p, q'; O) = −Σ_{v ∉ O} p(v) log q̃'(v), q̃' renormalised outside O = top-k(first pass)."""
    p_logits, q_logits, first = torch.randn(4, 7), torch.randn(4, 7), torch.randn(4, 7)
    out = first.topk(2, -1).indices
    p = p_logits.softmax(-1)
    ref = []
    for i in range(4):
        rest = [v for v in range(7) if v not in out[i].tolist()]
        logq = q_logits[i, rest].log_softmax(-1)
        ref.append(-(p[i, rest] * logq).sum())
    torch.testing.assert_close(fresh_ce(p_logits, q_logits, first, 2), torch.stack(ref))
    # the draft's logits on offered tokens do not matter; all target mass offered: nothing to learn
    q2 = q_logits.scatter(-1, out, 50.0)
    torch.testing.assert_close(fresh_ce(p_logits, q2, first, 2), fresh_ce(p_logits, q_logits, first, 2))
    sure = torch.full((4, 7), -1e4).scatter(-1, out[:, :1], 0.0)
    assert torch.all(fresh_ce(sure, q_logits, first, 2).abs() < 1e-6)


def test_init_copies_a_drafter_and_refuses_one_that_does_not_fit(tmp_path):
    from gambit.model import load_model
    from gambit.paths import ASSETS, TARGET
    from gambit.speculative.drafter import load_drafter, save_drafter
    from gambit.train.drafter import build_drafter, init_from

    target, _ = load_model(TARGET)
    src = ASSETS / "drafter-eagle3.1"
    drafter = build_drafter(TrainDrafterConfig(method="pr"), target)
    init_from(drafter, str(src), target)
    ref = load_drafter(src, target).state_dict()
    got = drafter.state_dict()
    assert set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    with pytest.raises(ValueError, match="num_layers"):
        init_from(build_drafter(TrainDrafterConfig(method="pr", num_layers=2), target), str(src), target)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        init_from(build_drafter(TrainDrafterConfig(), target, torch.arange(50)), str(src), target)
    save_drafter(build_drafter(TrainDrafterConfig(), target, torch.arange(50)), tmp_path / "reduced")
    with pytest.raises(ValueError, match="d2t"):
        init_from(build_drafter(TrainDrafterConfig(), target, torch.arange(1, 51)), str(tmp_path / "reduced"),
                  target)


def test_reconsider_weight_scales_the_reconsideration_term_only():
    """L(λ) = L_one-pass + λ · L_reconsider (``--reconsider-weight``); the one-pass part is EAGLE-3.1's
    loss on the same batch (reconsider rows are invisible to regular rows), and λ = 0 is refused."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speculative"))
    from spec_util import tiny_target

    from gambit.speculative.drafter import random_drafter
    from gambit.train.drafter import step_loss

    with pytest.raises(ValueError, match="reconsider_weight"):
        TrainDrafterConfig(method="pr", reconsider_weight=0.0)
    torch.manual_seed(0)
    target, tok = tiny_target(seed=1)
    drafter = random_drafter(target, seed=2, std=0.1)
    B, T, H = 2, 9, target.config.hidden_size
    batch = {"ids": torch.randint(3, 90, (B, T)), "taps": torch.randn(B, T, 3 * H),
             "logits": torch.randn(B, T, target.config.vocab_size),
             "length": torch.tensor([T, T - 2]), "prompt_len": torch.tensor([2, 3])}

    def loss(method: str, lam: float) -> torch.Tensor:
        cfg = TrainDrafterConfig(method=method, reconsider_weight=lam, ttt_steps=2)
        recon = make_reconsider(cfg, torch.Generator().manual_seed(0)) if cfg.uses_pr else None
        with torch.no_grad():
            return step_loss(cfg, drafter, batch, tok.pad_id, recon)

    one_pass, full, half = loss("eagle3.1", 1.0), loss("pr", 1.0), loss("pr", 0.5)
    assert full > one_pass
    torch.testing.assert_close(half, one_pass + 0.5 * (full - one_pass))
    from gambit.train.drafter_card import LOSSES, _loss  # the card writes the loss as trained

    assert _loss({"method": "pr"}) == LOSSES["pr"]
    assert _loss({"method": "hass+pr", "reconsider_weight": 0.5}).endswith(
        "+ 0.5 · (mean_{R_i} CE(p_t, q'_{i,j}) + β · mean_{C_i} CE(p_t, q'_{i,j}))]")


@pytest.mark.parametrize("values, said", [
    ({"method": "eagle3.1", "beta": 0.0, "self_query": False}, "--beta, --no-self-query: for --method pr | "
                                                               "hass+pr only, not eagle3.1"),
    ({"method": "hass", "reconsider_frac": 0.5, "reconsider_loss": "fresh"},
     "--reconsider-frac, --reconsider-loss: for --method pr | hass+pr only, not hass"),
    ({"method": "eagle3.1", "reconsider_weight": 0.5}, "--reconsider-weight: for --method pr"),
    ({"method": "pr", "hass_topk": 3, "hass_weight": 5.0}, "--hass-topk, --hass-weight: for --method hass | "
                                                           "hass+pr only, not pr"),
    ({"method": "pr", "fresh_k": 3}, "--fresh-k: for --reconsider-loss fresh only")])
def test_flags_of_another_method_are_refused(values, said):
    """They were ignored (the weights byte-identical), and the card's command still listed them."""
    with pytest.raises(ValueError, match=re.escape(said)):
        TrainDrafterConfig(**values)
    TrainDrafterConfig(method="hass+pr", beta=0.0, hass_topk=3, reconsider_loss="fresh", fresh_k=3)


def test_a_batch_larger_than_the_data_is_refused():
    """The batch was cut to n_train while the card said "× 100 sequences"."""
    with pytest.raises(ValueError, match=r"batch_size must be <= n_train \(8 sequences\), got 9"):
        TrainDrafterConfig(batch_size=9, n_train=8)
    TrainDrafterConfig(batch_size=8, n_train=8)


def test_a_draft_vocabulary_as_wide_as_the_target_is_refused():
    """Clamped to the whole vocabulary while the card named a reduced one of 5000 ids."""
    with pytest.raises(ValueError, match=r"draft_vocab must be < the target's vocabulary \(100 tokens"):
        TrainDrafterConfig(draft_vocab=5000)
    with pytest.raises(ValueError, match="draft_vocab"):
        TrainDrafterConfig(draft_vocab=100)
    assert TrainDrafterConfig(draft_vocab=50).draft_vocab == 50


def test_an_init_that_does_not_fit_is_refused_before_the_data(tmp_path):
    """init_from compared layers and vocabulary after the data was generated (~20 min for SmolLM2); a
    target folder gave a ~60-name "lacks tensor(s)" list."""
    import shutil

    from gambit.paths import ASSETS, TARGET

    src = ASSETS / "drafter-eagle3.1"
    with pytest.raises(ValueError, match="num_layers is 1, this run trains 2"):
        TrainDrafterConfig(method="pr", init=str(src), num_layers=2)
    with pytest.raises(ValueError, match="draft_vocab_size is 100, this run trains 50"):
        TrainDrafterConfig(init=str(src), draft_vocab=50)
    with pytest.raises(ValueError, match=r"not an EAGLE-3 drafter \(architectures \['LlamaForCausalLM'\]\)"):
        TrainDrafterConfig(init=str(TARGET))
    other = tmp_path / "taps"
    shutil.copytree(src, other)
    conf = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**conf, "target_taps": [0, 2, 4]}))
    with pytest.raises(ValueError, match=r"target_taps is \(0, 2, 4\), this run trains \(1, 3, 5\)"):
        TrainDrafterConfig(init=str(other))
    published = {k: v for k, v in conf.items() if k not in ("fc_norm", "norm_output")}  # EAGLE-3's own
    (other / "config.json").write_text(json.dumps(published))
    with pytest.raises(ValueError, match="fc_norm is False, this run trains True"):
        TrainDrafterConfig(init=str(other))


def test_a_bad_output_folder_is_refused_before_the_data(tmp_path):
    from gambit.train.drafter import train_drafter

    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="out: .*afile is a file; give a folder"):
        train_drafter(TrainDrafterConfig(out=str(tmp_path / "afile")))
    with pytest.raises(ValueError, match="out: /proc/gambit-out: cannot write in /proc"):
        train_drafter(TrainDrafterConfig(out="/proc/gambit-out"))


def test_saved_weights_follow_the_umask(tmp_path):
    """safetensors writes 0600 and mkdtemp 0700: a model trained by one user, unreadable to another."""
    import os
    import stat

    from gambit.model.loader import readable

    (tmp_path / "w").write_text("")
    (tmp_path / "w").chmod(0o600)
    old = os.umask(0o027)
    try:
        readable(tmp_path, tmp_path / "w")
    finally:
        os.umask(old)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "w").stat().st_mode) == 0o640
