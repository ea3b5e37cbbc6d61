"""A Target's lifecycle edges: its engine stuck or its thread dead (new runs are refused at once, those
waiting for admission too), and ``close()`` (the scorer client closed with it; a second call returns)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import torch
from serving_util import until

from gambit.serving import target_heartbeat
from gambit.serving.embedded import EmbeddedConfig, build_target
from gambit.serving.solve_config import SolveConfig
from gambit.serving.target_service import EngineStuck

PROBLEM = "Compute 2+3."
CFG = SolveConfig(capacity=2, swap=1, max_tokens=8, seed=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread, restored




def test_a_stuck_replica_refuses_new_and_queued_runs_at_once(monkeypatch):
    """Its heartbeat was withheld, yet a run sent to it queued behind the stuck step: it sent no "started",
    so the Coordinator never read its lease, and the client waited as long as the step (for ever if hung)."""
    monkeypatch.setattr(target_heartbeat, "HEARTBEAT_S", 0.05)
    svc = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-wedged")
    release = threading.Event()
    ended: list[dict] = []
    try:
        svc.progress.stuck_s = 0.3
        running = SolveConfig(capacity=2, swap=1, max_tokens=600, seed=1)
        assert svc.submit_run("q0", PROBLEM, running, ended.append).result(timeout=5) is None
        inside = threading.Event()
        hung = svc.call(lambda: inside.set() or release.wait(10))  # a step that does not end
        assert inside.wait(5)
        queued = svc.submit_run("q1", PROBLEM, CFG, lambda d: None)  # in before it counts as stuck
        assert until(lambda: not svc.progress.moving())
        assert isinstance(queued.exception(timeout=2), EngineStuck)  # old code: waited for the step
        fresh = svc.submit_run("q2", PROBLEM, CFG, lambda d: None)
        assert fresh.done() and isinstance(fresh.exception(), EngineStuck)  # old code: queued
        assert "r-wedged" in str(fresh.exception()) and "another replica" in str(fresh.exception())
        answer: list = []
        waiter = threading.Thread(target=lambda: answer.append(svc.cancel("q0")), daemon=True)
        waiter.start()
        waiter.join(2)
        assert answer == [True]  # old code: waited for the stuck step (a thread per CancelRun, for ever)
        release.set()
        assert hung.result(timeout=5)
        assert until(svc.progress.moving)  # the step after the hung work ended too
        ok = svc.submit_run("q3", PROBLEM, CFG, lambda d: None)  # moving again: admitted
        assert ok.result(timeout=5) is None
        assert svc.tree.get_run("q1") is None and svc.tree.get_run("q2") is None  # never admitted
        assert until(lambda: any(d["kind"] == "result" for d in ended))  # stopped once it moved again
        assert [d["status"] for d in ended if d["kind"] == "result"] == ["cancelled"]
    finally:
        release.set()
        svc.cancel("q3")
        svc.close()


def test_a_run_sent_after_the_engine_thread_died_is_refused_at_once():
    """The engine thread died (an error outside the step's guard): ``call`` refused at once, but a run was
    queued for it and its future never ended (the Target's stream and its client waited for ever)."""
    svc = build_target(EmbeddedConfig(num_blocks=120), None)
    try:
        def die():
            raise SystemExit  # not an Exception: it ends the engine thread, as a bug outside the guard would

        svc.call(die)
        assert until(lambda: not svc._thread.is_alive())
        fut = svc.submit_run("after", PROBLEM, CFG, lambda d: None)
        assert isinstance(fut.exception(timeout=2), RuntimeError) and "stopped" in str(fut.exception())
    finally:
        svc.close()


def test_close_closes_the_scorer_client_and_a_second_close_returns_at_once():
    """``close()`` never closed the RemoteScorer: its sender thread and gRPC channels lived until the process
    exited (a Target replica rebuilt in-process, or tests, leaked them)."""
    prefix = f"test-h-close-{uuid.uuid4().hex[:8]}:"  # Redis records: a writer thread (``RecordWriter``)
    svc = build_target(EmbeddedConfig(num_blocks=120, scorer_address="127.0.0.1:1", prefix=prefix,
                                      tree="redis://127.0.0.1:6379/0"), None)
    try:
        scorer = svc.scorer
        scorer.timeout_s = 0.2
        scorer.score_async(["k"], torch.zeros(1, scorer.width)).result(timeout=5)  # unreachable: fallback
        sender = scorer._sender
        assert sender is not None and sender.is_alive()
        svc.close()
        assert not sender.is_alive() and scorer._closed and not scorer._channels  # old code: alive, open
        t0 = time.perf_counter()
        svc.close()  # old code: 5 s (it flushed the closed record writer and waited out the flush)
        assert time.perf_counter() - t0 < 1.0
    finally:
        svc.close()
        keys = list(svc.tree.r.scan_iter(f"{prefix}*"))
        if keys:
            svc.tree.r.delete(*keys)
