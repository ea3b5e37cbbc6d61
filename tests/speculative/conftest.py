"""Shared fixtures for the speculative tests."""

from __future__ import annotations

import pytest
from spec_util import one_thread, tiny_target


@pytest.fixture(scope="session")
def tiny():
    """A 6-layer, hidden-32 random target and the char tokenizer."""
    return tiny_target()


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield
