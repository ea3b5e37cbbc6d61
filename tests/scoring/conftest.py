"""Rollout chunks regenerated from scratch by the shipped target (each a few seconds on 2 threads)."""

from __future__ import annotations

import pytest
from scoring_util import shipped_config

from gambit.scoring.rollouts import collect_rollouts


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
