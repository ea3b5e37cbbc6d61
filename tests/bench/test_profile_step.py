"""``gambit bench profile``: its flags are checked before the model loads."""

from __future__ import annotations

import pytest
from bench_util import refused_before

import gambit.bench.profile_step as profile_step


@pytest.mark.parametrize(("args", "message"), [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--model", "/nonexistent"], "--model /nonexistent: no model folder there"),
])
def test_bad_flags_are_refused_before_the_model_loads(monkeypatch, args, message):
    """Each a traceback once (0 steps: an IndexError after the whole profile)."""
    refused_before(monkeypatch, profile_step, "profile", profile_step.main, args, message)
