"""Rollout chunks regenerated from scratch by the shipped target (each a few seconds on 2 threads).

Under this process's own kernels (``isa="machine"``): the scorers' cards were written under
``--isa compatible``, whose rollouts only a pinned child writes (``test_reproducible`` does that); these
chunks are data to score, where a last-digit difference in the floats does not matter."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scoring_util import shipped_config

from gambit.scoring.rollouts import collect_rollouts


@pytest.fixture(scope="session")
def train_chunk():
    """The first rollout chunk of the shipped scorers' training data (train split)."""
    cfg = shipped_config("mlp")
    rc = replace(cfg.rollouts("train"), isa="machine", n_problems=cfg.repro_problems)
    return collect_rollouts(rc, cache_dir="", quiet=True)


@pytest.fixture(scope="session")
def heldout_chunk():
    """A small fixed held-out set: the first two rollout chunks of the dev-split problems (16; at 8 a
    final-label scorer's trace AUC swings ±0.15 with the problems drawn)."""
    cfg = shipped_config("mlp")
    rc = cfg.rollouts("dev")
    rc = replace(rc, isa="machine", n_problems=2 * rc.chunk_problems)
    return collect_rollouts(rc, cache_dir="", quiet=True)
