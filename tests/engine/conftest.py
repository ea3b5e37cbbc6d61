"""Shared fixtures for the engine tests: the target model folder and a tiny model.

``target_folder`` is the shipped model when it has been trained, else a stand-in of the same
architecture with weights drawn ``normal(std=0.2)`` under a fixed seed (large enough that greedy
decoding does not collapse onto one token), built once per session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_util import SHIPPED, build_standin, one_thread, tiny_model

from gambit.model import load_model


@pytest.fixture(scope="session")
def target_folder(tmp_path_factory) -> Path:
    if (SHIPPED / "config.json").exists() and any(SHIPPED.glob("*.safetensors")):
        return SHIPPED
    with one_thread():
        return build_standin(tmp_path_factory.mktemp("standin") / "target")


@pytest.fixture(scope="session")
def target(target_folder):
    """(model, tokenizer) of the target folder, fp32 on CPU."""
    return load_model(target_folder, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tiny():
    """A 2-layer, hidden-32 random model and the char tokenizer."""
    return tiny_model()


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these models are tiny, and the CPUs may be shared with training."""
    with one_thread():
        yield
