"""One OpenMP pool per serving process (``gambit.engine.torch_threads``).

A second thread that ran torch's parallel work makes libgomp stop spinning, so each parallel region
of an engine step sleeps and wakes the other core. This counts the engine thread's voluntary context
switches per step of real embedded runs in fresh processes, with the wiring as shipped and with a
main thread that did parallel work first (the failure the rule avoids), so it can fail.
"""

import os
import sys

import pytest

from gambit.bench.pools import run_child


def _per_step(mode: str) -> float:
    got = run_child(mode, capacity=4, max_tokens=64, runs=3)
    assert got["steps"] > 30
    return got["switches_per_step"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux"),
                    reason="needs 2+ CPUs (two OpenMP threads) and Linux's /proc")
def test_engine_thread_keeps_its_openmp_workers_awake():
    shipped = _per_step("one pool")
    throttled = _per_step("two pools")
    # measured on 2 cores: ~1-2 per step as shipped, ~30-65 with a second pool
    assert shipped < 8, f"{shipped:.1f} voluntary context switches per engine step"
    assert throttled > 2 * shipped + 5, (shipped, throttled)
