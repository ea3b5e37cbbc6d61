"""A Target replica after a takeover (a real engine, the shipped target; records in memory): the run it
lost is stopped and not written over the new replica's record, and a cancel flag seen during a long step
does not hold its heartbeat back."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch

from gambit.serving.embedded import EmbeddedConfig, build_target
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.arithmetic import TaskConfig, generate

PROBLEM = generate("test", 1, 0, TaskConfig(3, 4))[0].prompt


@pytest.fixture
def svc(monkeypatch):
    from gambit.serving import target_heartbeat

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(target_heartbeat, "HEARTBEAT_S", 0.05)
    s = build_target(EmbeddedConfig(scorer="random:mlp:192", num_blocks=200), None, replica="A")
    yield s
    s.close()
    torch.set_num_threads(n)


def _result(got: queue.Queue) -> dict:
    while (d := got.get(timeout=60))["kind"] != "result":
        pass
    return d


def test_a_run_taken_over_is_stopped_here_and_its_record_stays_the_new_replicas(svc):
    """Before: the recovered replica ran it on and wrote its progress and result over B's record."""
    got: queue.Queue = queue.Queue()
    taken = threading.Event()

    def sink(d: dict) -> None:
        if d["kind"] == "progress" and not taken.is_set():  # B resumes the run meanwhile
            svc.tree.put_run("t1", status="running", replica="B")
            svc.delivery.written["t1"] = 0.0  # the next round's progress is written (not throttled)
            taken.set()
        got.put(d)

    cfg = SolveConfig(capacity=2, round_interval=4, warmup=2, max_tokens=400, seed=1)
    svc.start_run("t1", PROBLEM, cfg, sink)
    res = _result(got)
    assert res["status"] == "cancelled" and "taken over by Target replica B" in res["message"]
    rec = svc.tree.get_run("t1")
    assert (rec["status"], rec["replica"]) == ("running", "B") and "result" not in rec
    assert svc.load()["runs"] == 0 and svc.engine.kv_usage() == 0.0


def test_a_cancel_flag_during_a_long_step_does_not_hold_the_heartbeat_back(svc):
    """The heartbeat's thread waited in ``cancel`` for the step under way to end: a long step (legit up to
    STUCK_S) with a run flagged withheld the beat, and every run here could be taken over."""
    got: queue.Queue = queue.Queue()
    release = threading.Event()
    svc.tree.lease_s = 0.5
    cfg = SolveConfig(capacity=2, max_tokens=400, seed=1)
    svc.start_run("f1", PROBLEM, cfg, got.put)
    long_step = svc.call(lambda: release.wait(10))  # a step that lasts (not stuck: STUCK_S is 120 s)
    try:
        deadline = time.monotonic() + 10
        while not long_step.running():
            assert time.monotonic() < deadline, "the engine thread never took the long step"
            time.sleep(0.01)
        svc.tree.request_cancel("f1")
        time.sleep(0.8)
        assert svc.tree.stale_beat({"status": "running", "replica": "A"}) is None  # still beating
    finally:
        release.set()
    res = _result(got)
    assert res["status"] == "cancelled" and svc.load()["runs"] == 0
