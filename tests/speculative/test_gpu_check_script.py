"""``tools/gpu_check.py``, the script a session with a GPU runs first, on the CPU's torch path (no C++
kernels, as on CUDA): it must run, find every speculative output equal to plain greedy decoding in
float32 and bfloat16, and write what a GPU session reads back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_the_cpu_path(tmp_path):
    out = tmp_path / "gpu_check.json"
    # one torch thread: the shipped target's steps are too small to gain from two, and on a busy 2-core
    # host two threads' OpenMP barriers made this run 2-3x as long (``gambit.engine.step_threads``)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "services"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu", "--quick",
                        "--dtypes", "float32,bfloat16", "--json", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["lossless"] is True and set(r["checks"]) == {"float32", "bfloat16"}
    for dtype, c in r["checks"].items():
        assert len(c["lossless"]) == 8 and all(c["lossless"].values()), dtype
        assert c["plain_equal_to_cpu_fp32"] + len(c["plain_first_difference"]) == r["prompts"] == 3
        assert all(t > 1.0 for t in c["tau"].values())  # the shipped drafters draft accepted tokens
        assert set(c["speed_batch1"]) == set(c["tau"])
    assert r["checks"]["float32"]["plain_equal_to_cpu_fp32"] == 3  # the same floats' path, same device
