"""Shared fixtures for the speculative tests."""

from __future__ import annotations

import pytest
from spec_util import one_thread, tiny_target

from gambit.model import load_model
from gambit.paths import TARGET


@pytest.fixture(scope="session")
def tiny():
    """A 6-layer, hidden-32 random target and the char tokenizer."""
    return tiny_target()


@pytest.fixture(scope="session")
def target():
    """The shipped target (float32 on the CPU), loaded once for the files that decode with it."""
    return load_model(TARGET, device="cpu", dtype="float32")


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield
