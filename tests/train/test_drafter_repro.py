"""Shipped drafters are reproducible by their command: the first steps give the card's loss history
(exactly on the CPU instruction set the card records, within ``CROSS_ISA_RTOL`` on another)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from gambit.paths import ASSETS
from gambit.train.drafter import TrainDrafterConfig, train_drafter
from gambit.train.repro import compare_history, history_rtol

STEPS = 4


@pytest.mark.parametrize("name", ["drafter-pr", "drafter-eagle3.1"])
def test_first_steps_match_the_card(name):
    folder = ASSETS / name
    if not (folder / "training.json").is_file():
        pytest.skip(f"{name} not shipped yet")
    card = json.loads((folder / "training.json").read_text())
    known = {f.name for f in fields(TrainDrafterConfig)}
    cfg = TrainDrafterConfig(**{k: v for k, v in card["config"].items() if k in known and k != "target"})
    assert cfg.threads == card["torch_threads"]
    fresh = train_drafter(cfg, stop=STEPS)
    assert len(fresh["loss_history"]) == STEPS
    rtol = history_rtol(card["cpu_capability"], card.get("cpu_amx", False))  # exact on the card's ISA
    assert compare_history(card["loss_history"], fresh["loss_history"], upto=STEPS - 1, rtol=rtol) == []
    readme = (folder / "README.md").read_text()
    assert card["torch_version"] and f"{card['torch_threads']} CPU threads" in readme
