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


def _per_step(mode: str) -> tuple[float, bool]:
    # C = 16: steps of 16 rows run on both threads (fewer run on one, EngineConfig.min_macs_per_thread)
    got = run_child(mode, capacity=16, max_tokens=64, runs=3)
    assert got["steps"] > 80  # past the Target's own check (SWITCH_CHECK)
    return got["switches_per_step"], got["warned"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not sys.platform.startswith("linux"),
                    reason="needs 2+ CPUs (two OpenMP threads) and Linux's /proc")
def test_engine_thread_keeps_its_openmp_workers_awake():
    shipped, warned = _per_step("one pool")
    throttled, warned_throttled = _per_step("two pools")
    # measured on 2 cores: 0-1 per step as shipped, ~30 with a second pool
    assert shipped < 8, f"{shipped:.1f} voluntary context switches per engine step"
    assert throttled > 2 * shipped + 5, (shipped, throttled)
    # the Target reports the second pool in its log, and stays quiet without one
    assert warned_throttled and not warned
