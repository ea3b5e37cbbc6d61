"""Fixtures for the search tests: the shipped target on CPU, engines, a stand-in scorer, Redis."""

from __future__ import annotations

import uuid

import pytest
import torch

from gambit.engine import Engine, EngineConfig
from gambit.model import load_model
from gambit.paths import TARGET
from gambit.search.standin import StandInScorer
from gambit.tasks.arithmetic import TaskConfig, generate


@pytest.fixture(scope="session")
def target():
    return load_model(TARGET, device="cpu", dtype="float32")


@pytest.fixture
def make_engine(target):
    def make(**cfg) -> Engine:
        model, tok = target
        return Engine(model, tok, EngineConfig(preemption="evict", **cfg))
    return make


@pytest.fixture
def scorer(target):
    return StandInScorer(target[0].config.hidden_size, seed=1)


@pytest.fixture(scope="session")
def hard_problems():
    """Held-out (dev split) problems with 7-8 operations: traces of ~80-110 tokens."""
    return generate("dev", 6, 0, TaskConfig(7, 8))


@pytest.fixture(autouse=True)
def _threads():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def redis_store():
    """A RedisStore on the real server under a random prefix, cleaned up afterwards."""
    from gambit.search.redis_store import RedisStore

    store = RedisStore(prefix=f"test-{uuid.uuid4().hex[:8]}")
    yield store
    store.clear()
