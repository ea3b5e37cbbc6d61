"""Rollout chunks regenerated from scratch by the shipped target (each a few seconds on 2 threads).

Under this process's own kernels (``isa="machine"``): the scorers' cards were written under
``--isa compatible``, whose rollouts only a pinned child writes (``test_reproducible`` does that); these
chunks are data to score, where a last-digit difference in the floats does not matter. So they run on one
thread (``THREADS``): on a quiet 2-core host two threads save ~1 s of the held-out chunk's ~3 s, but on
a busy one their OpenMP barriers made it take up to 23 s (its AUCs are the same to four places on one
thread or two)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scoring_util import shipped_config

from gambit.scoring.rollouts import collect_rollouts

THREADS = 1


@pytest.fixture(scope="session")
def train_chunk():
    """The first rollout chunk of the shipped scorers' training data (train split)."""
    cfg = shipped_config("mlp")
    rc = replace(cfg.rollouts("train"), isa="machine", n_problems=cfg.repro_problems, threads=THREADS)
    return collect_rollouts(rc, cache_dir="", quiet=True)


@pytest.fixture(scope="session")
def heldout_chunk():
    """A small fixed held-out set: the first two rollout chunks of the dev-split problems (16; at 8 a
    final-label scorer's trace AUC swings ±0.15 with the problems drawn)."""
    cfg = shipped_config("mlp")
    rc = cfg.rollouts("dev")
    rc = replace(rc, isa="machine", n_problems=2 * rc.chunk_problems, threads=THREADS)
    return collect_rollouts(rc, cache_dir="", quiet=True)
