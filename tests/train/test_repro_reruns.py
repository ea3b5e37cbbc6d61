"""The background drafter reruns (what the reproducibility tests read): a failure reaches the waiting
test with its cause, and stopping ends the whole process group."""

from __future__ import annotations

import os

import pytest

from gambit.train import repro_reruns


def test_a_failed_rerun_reaches_its_test_with_the_cause(tmp_path):
    runs = repro_reruns.start({"no-such-drafter": 1}, tmp_path / "cache", tmp_path / "out")
    try:
        with pytest.raises(RuntimeError, match="no-such-drafter"):
            runs.result("no-such-drafter", timeout_s=120)
        with pytest.raises(KeyError, match="drafter-pr"):
            runs.result("drafter-pr")
        assert runs.proc.wait(timeout=60) == 0  # it went on past the failure and ended by itself
    finally:
        runs.stop()


def test_stop_kills_the_process_group(tmp_path):
    runs = repro_reruns.start({"drafter-pr": 200}, tmp_path / "cache", tmp_path / "out")
    assert os.getpriority(os.PRIO_PROCESS, runs.proc.pid) >= repro_reruns.NICE
    runs.stop()
    assert runs.proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(runs.proc.pid, 0)
    with pytest.raises(RuntimeError, match="exited"):
        runs.result("drafter-pr", timeout_s=5)


def test_nothing_to_rerun_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no drafter"):
        repro_reruns.start({}, tmp_path / "cache", tmp_path / "out")
