"""tools/gpu_graphs.py (the next GPU lease's check of CUDA-graph decoding) runs on the CPU's static path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_graphs_script_runs_on_the_cpu(tmp_path):
    out = tmp_path / "g.json"
    # one torch thread: the shipped target's steps gain nothing from two, and on a busy 2-core host two
    # threads' OpenMP barriers made this run ~15x as long (``gambit.engine.step_threads``)
    env = {**os.environ, "PYTHONPATH": str(REPO / "services"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_graphs.py"), "--device", "cpu", "--batches",
                        "1,3", "--tokens", "12", "--reps", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["mode"] == "static" and res["float32_equal"]
    f32 = res["dtypes"]["float32"]
    assert f32["equal"]["16"] == {"equal": 16, "of": 16, "first_differences": []}
    assert set(f32["speed"]) == {"1", "3"} and all(s["graphs_captured"] >= 1 for s in f32["speed"].values())
