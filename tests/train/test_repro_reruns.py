"""The background drafter reruns (what the reproducibility tests read): a failure reaches the waiting
test with its cause, and stopping ends the whole process group."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


def test_a_killed_session_leaves_no_rerun_and_no_folder(tmp_path):
    """A session killed past its finish hook (``timeout``'s SIGTERM): the reruns see their parent gone,
    end their training child and remove their folders."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom gambit.train import repro_reruns\n"
         "r = repro_reruns.start({'drafter-pr': 200}, sys.argv[1], sys.argv[2])\n"
         "print(r.proc.pid, flush=True)\ntime.sleep(120)", str(tmp_path / "cache"), str(tmp_path / "out")],
        stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (_alive_in_group(pid) or (tmp_path / "out").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive_in_group(pid) and not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def _alive_in_group(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies left to an init that does not reap: not)."""
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # state, ppid, pgrp, ...
        if entry.isdigit() and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False
