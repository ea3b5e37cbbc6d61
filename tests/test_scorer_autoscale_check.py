"""``tools/scorer_autoscale_check.py`` refuses a setting that cannot give a scale-up before it starts Ray:
a --max-replicas of 1 (nothing to scale to), no clients, a NaN or zero target or bound. Its live run (Ray
Serve, ~40 s) is the README's figure, not a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, says", [
    (["--max-replicas", "1"], "--max-replicas must be >= 2, got 1"),
    (["--clients", "0"], "--clients must be >= 1, got 0"),
    (["--target", "nan"], "--target must be > 0, got nan"),
    (["--up-s", "0"], "--up-s must be > 0, got 0.0"),
    (["--downscale-delay-s", "-1"], "--downscale-delay-s must be >= 0, got -1.0"),
])
def test_bad_settings_are_refused_before_ray_starts(argv, says):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "services"))
    proc = subprocess.run([sys.executable, "tools/scorer_autoscale_check.py", *argv], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    assert "Ray" not in proc.stdout + proc.stderr
