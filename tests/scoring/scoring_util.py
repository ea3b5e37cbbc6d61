"""Helpers shared by the scoring tests (imported as ``scoring_util``; a name no other test dir uses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit.paths import SCORER_MLP, SCORER_PROCESS, SCORER_SEQUENCE, TARGET
from gambit.scoring.train import TrainScorerConfig

SHIPPED = {"mlp": SCORER_MLP, "sequence": SCORER_SEQUENCE, "process": SCORER_PROCESS}


def shipped_training(kind: str) -> dict:
    path = SHIPPED[kind] / "training.json"
    if not path.is_file():
        pytest.skip(f"{path} not shipped yet")
    return json.loads(path.read_text())


def shipped_config(kind: str) -> TrainScorerConfig:
    cfg = TrainScorerConfig(**shipped_training(kind)["config"])
    if not Path(cfg.model).is_dir():  # recorded relative to the repo, or absolute on another machine
        cfg.model, cfg.out = str(TARGET), str(SHIPPED[kind])
    return cfg
