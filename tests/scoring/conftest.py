"""Rollout chunks regenerated from scratch by the shipped target (each a few seconds on 2 threads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gambit.paths import SCORER_MLP, SCORER_PROCESS, SCORER_SEQUENCE, TARGET
from gambit.scoring.rollouts import collect_rollouts
from gambit.scoring.train import TrainScorerConfig

SHIPPED = {"mlp": SCORER_MLP, "sequence": SCORER_SEQUENCE, "process": SCORER_PROCESS}


def shipped_training(kind: str) -> dict:
    path = SHIPPED[kind] / "training.json"
    if not path.is_file():
        pytest.skip(f"{path} not shipped yet")
    return json.loads(path.read_text())


def shipped_config(kind: str) -> TrainScorerConfig:
    cfg = TrainScorerConfig(**shipped_training(kind)["config"])
    if not Path(cfg.model).is_dir():  # recorded as an absolute path on the machine that trained it
        cfg.model, cfg.out = str(TARGET), str(SHIPPED[kind])
    return cfg


@pytest.fixture(scope="session")
def train_chunk():
    """The first rollout chunk of the shipped scorers' training data (train split)."""
    cfg = shipped_config("mlp")
    rc = cfg.rollouts("train")
    rc.n_problems = cfg.repro_problems
    return collect_rollouts(rc, cache_dir="", quiet=True)


@pytest.fixture(scope="session")
def heldout_chunk():
    """A small fixed held-out set: the first rollout chunk of the dev-split problems."""
    cfg = shipped_config("mlp")
    rc = cfg.rollouts("dev")
    rc.n_problems = rc.chunk_problems
    return collect_rollouts(rc, cache_dir="", quiet=True)
