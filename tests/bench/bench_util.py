"""Helpers of the bench tests."""

from __future__ import annotations

import re

import pytest


def refused_before(monkeypatch, module, work: str, main, args: list[str], message: str) -> None:
    """``main(args)`` raises a ValueError starting with ``message`` before ``module.work`` (patched to
    fail if reached: the model load, the children, the measurement) runs."""
    def never(*a, **k):
        raise AssertionError(f"{work} ran before the check")

    monkeypatch.setattr(module, work, never)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        main(args)
