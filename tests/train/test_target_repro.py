"""The shipped target is reproducible by its command: the first 200 steps give the card's loss history."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from gambit.paths import TARGET
from gambit.train.repro import compare_history
from gambit.train.target import TrainTargetConfig, train_target


def card_config(tmp_path) -> tuple[dict, TrainTargetConfig]:
    card = json.loads((TARGET / "training.json").read_text())
    known = {f.name for f in fields(TrainTargetConfig)}
    cfg = {k: v for k, v in card["config"].items() if k in known}
    cfg.update(out=str(tmp_path / "target"), threads=card["torch_threads"])
    return card, TrainTargetConfig(**cfg)


def test_card_records_environment():
    card = json.loads((TARGET / "training.json").read_text())
    assert card["torch_threads"] >= 1 and card["torch_version"].startswith("2.")
    assert f"{card['torch_threads']} CPU threads" in (TARGET / "README.md").read_text()


def test_first_200_steps_match_the_card(tmp_path):
    card, cfg = card_config(tmp_path)
    fresh = train_target(cfg, stop=201)
    assert [h["step"] for h in fresh["loss_history"]] == [0, 100, 200]
    assert compare_history(card["loss_history"], fresh["loss_history"], upto=200) == []
    assert not (tmp_path / "target").exists()  # stop= saves nothing


def test_history_comparison_catches_a_difference():
    a = [{"step": 0, "loss": 1.0}, {"step": 100, "loss": 0.5}]
    assert compare_history(a, a, 100) == []
    assert compare_history(a, [{"step": 0, "loss": 1.0}, {"step": 100, "loss": 0.50001}], 100)
    assert compare_history(a, a[:1], 100)  # a missing step is a mismatch
    with pytest.raises(ValueError, match="threads"):
        TrainTargetConfig(threads=0)
