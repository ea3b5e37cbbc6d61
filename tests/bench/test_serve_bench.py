"""``gambit bench serve``'s load shape: n clients in a closed loop, each sending its share in turn."""

from __future__ import annotations

import threading
import time

import pytest

from gambit.bench.serve import BenchServeConfig, _threads


def test_clients_keep_n_runs_in_flight_and_send_every_run_once():
    lock, live, peak, seen = threading.Lock(), [0], [0], []

    def run(i: int) -> None:
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            seen.append(i)
        time.sleep(0.01)
        with lock:
            live[0] -= 1

    _threads(run, 12, clients=4)
    assert sorted(seen) == list(range(12)) and peak[0] == 4
    seen.clear()
    _threads(run, 3)  # default: one burst, every run at once
    assert sorted(seen) == [0, 1, 2]


def test_waves_must_be_positive():
    with pytest.raises(ValueError, match="waves"):
        BenchServeConfig(waves=0)


def test_one_run_pairs_must_be_positive():
    with pytest.raises(ValueError, match="one_run_pairs"):
        BenchServeConfig(one_run_pairs=0)


@pytest.mark.parametrize("levels", ["a", "1,x", "0", ""])
def test_concurrency_must_be_positive_integers(levels):
    with pytest.raises(ValueError, match=f"concurrency: comma-separated integers >= 1, got {levels!r}"):
        BenchServeConfig(concurrency=levels)


@pytest.mark.parametrize("levels", ["2,4", "16,1", "1,4,4", "1,16,4"])
def test_concurrency_levels_increase_from_one_run(levels):
    """"2,4" printed its 2-run figures as the "1 run" wall ratio (and the JSON's wall_ratio with them)."""
    want = r"concurrency: increasing levels starting at 1 .*got " + repr(levels)
    with pytest.raises(ValueError, match=want):
        BenchServeConfig(concurrency=levels)
    assert BenchServeConfig(concurrency="1,2").levels == [1, 2]
