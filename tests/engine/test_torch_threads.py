"""One OpenMP pool per serving process (``gambit.engine.torch_threads``).

A second thread that ran torch's parallel work makes libgomp stop spinning, so each parallel region
of an engine step sleeps and wakes the other core. The subprocess test counts the engine thread's
voluntary context switches per step of a real embedded run, with the set-up as shipped and with a
main thread that did parallel work first (the failure the helper avoids), so it can fail.
"""

import json
import os
import subprocess
import sys
import threading

import pytest

from gambit.engine.torch_threads import on_fresh_thread, voluntary_switches

SCRIPT = r"""
import json, sys, threading, torch
torch.set_num_threads(2)
if sys.argv[1] == "main-pool":
    x = torch.randn(512, 512)
    for _ in range(20):
        (x @ x).sum()  # parallel regions on the main thread: its OpenMP pool stays for its life
from gambit.engine.torch_threads import voluntary_switches
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.arithmetic import TaskConfig, generate

emb = Embedded(EmbeddedConfig(scorer="random:mlp:192"))
eng = emb.target.engine
steps = [0]
step = eng.step
def counted():
    steps[0] += 1
    return step()
eng.step = counted
prompt = generate("dev", 1, 3, TaskConfig(3, 5))[0].prompt
cfg = SolveConfig(capacity=4, swap=1, round_interval=8, max_tokens=64, seed=0)
list(emb.solve(prompt, cfg))  # warm: kernels compiled, pools made
tid = emb.target.engine_thread_id
s0, n0 = voluntary_switches(tid), steps[0]
for _ in range(3):
    list(emb.solve(prompt, cfg))
print(json.dumps({"per_step": (voluntary_switches(tid) - s0) / max(1, steps[0] - n0),
                  "steps": steps[0] - n0}))
emb.close()
"""


def _per_step(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] > 30
    return got["per_step"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux"),
                    reason="needs 2+ CPUs (two OpenMP threads) and Linux's /proc")
def test_engine_thread_keeps_its_openmp_workers_awake():
    shipped = _per_step("shipped")
    throttled = _per_step("main-pool")
    # measured on 2 cores: ~1-2 per step as shipped, ~30-65 with a second pool
    assert shipped < 8, f"{shipped:.1f} voluntary context switches per engine step"
    assert throttled > 2 * shipped + 5, (shipped, throttled)


def test_on_fresh_thread_returns_and_raises_on_another_thread():
    seen = []
    assert on_fresh_thread(lambda: seen.append(threading.get_ident()) or 7) == 7
    assert seen and seen[0] != threading.get_ident()
    with pytest.raises(KeyError, match="boom"):
        on_fresh_thread(lambda: {}["boom"])


def test_voluntary_switches_reads_this_thread():
    n = voluntary_switches(threading.get_native_id())
    assert n >= 0 if sys.platform.startswith("linux") else n == -1
