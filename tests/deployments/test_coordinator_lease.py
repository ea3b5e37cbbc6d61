"""The Coordinator and the run lease (no Ray): a run whose replica's stream goes silent while its lease
lapses is taken over, a re-sent run no replica starts gives up at the takeover's deadline, and the
sweep ends a lost replica's runs that nobody reads (real Redis, a prefix of its own, deleted after)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest
from test_coordinator_grpc import PROBLEM, SHORT, Handle, _run, coordinator, pb2, served

from gambit.deployments import coordinator as coordinator_mod
from gambit.deployments import run_records
from gambit.deployments.run_records import ended_result, lease_lapsed, sweep_lost
from gambit.serving.tree_view import MemoryTreeView, RedisTreeView


def _started(run_id: str, replica: str, resumed: bool) -> dict:
    return {"kind": "started", "run_id": run_id, "replica": replica, "resumed": resumed, "restored": resumed}


def test_a_replica_whose_engine_stopped_has_its_run_taken_over_and_is_avoided(monkeypatch):
    """Its process lived on (Serve saw no actor error) but its engine stopped beating: the stream went
    silent and the client's Solve waited for ever, while GetRun said the run failed (lost)."""
    monkeypatch.setattr(coordinator_mod, "LEASE_POLL_S", 0.05)
    tree = MemoryTreeView()
    tree.lease_s = 0.2
    stopped = asyncio.Event()

    async def replicas(run_id, problem, cfg, resume=False):
        if not resume:  # r0 admits the run, beats once, then its engine stops: silence
            tree.put_run(run_id, status="running", replica="r0")
            tree.beat("r0")
            yield _started(run_id, "r0", False)
            try:
                await asyncio.Event().wait()
            finally:
                stopped.set()  # the Coordinator cancelled this stream
        tree.beat("r1")
        yield _started(run_id, "r1", True)
        tree.put_run(run_id, status="done", result=ended_result(run_id, "done", ""), replica="r1")
        yield ended_result(run_id, "done", "")

    handle = Handle(replicas)
    co = coordinator(tree, handle, max_resumes=1)
    co.target_replicas = 2

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="lease-silent", **SHORT)
            events = [ev async for ev in stub.Solve(req, timeout=10)]
            await asyncio.wait_for(stopped.wait(), 2)
            return events

    events = _run(go(), timeout_s=8)
    assert events[-1].result.status == "done" and events[1].started.resumed
    assert [k.get("resume", False) for k in handle.calls] == [False, True]
    assert handle.calls[1]["avoid"] == ("r0",)  # Serve would route to it again: it is alive to Serve
    rec = tree.get_run("lease-silent")
    assert (rec["status"], rec["replica"], rec["resumes"]) == ("done", "r1", 1)


def test_a_resent_run_that_no_replica_starts_gives_up_at_the_takeovers_deadline():
    """A takeover waited in Serve's queue (or on a replica that never admitted it) for ever, though a
    run is handed on "for at most resume_wait_s": the client got no answer and the run stayed running."""
    from ray.exceptions import RayActorError

    async def replicas(run_id, problem, cfg, resume=False):
        if not resume:
            yield _started(run_id, "r0", False)
            raise RayActorError()
        await asyncio.Event().wait()  # never admitted
        yield {}

    tree = MemoryTreeView()
    co = coordinator(tree, Handle(replicas), max_resumes=1)
    co.resume_wait_s = 0.3

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="lease-never", **SHORT)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                [ev async for ev in stub.Solve(req, timeout=10)]
            return e.value

    err = _run(go(), timeout_s=8)
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "within 0.3 s" in err.details()
    rec = tree.get_run("lease-never")
    assert rec["status"] == "failed" and "within 0.3 s" in rec["result"]["message"]


@pytest.fixture
def view():
    v = RedisTreeView(prefix=f"test-sweep-{uuid.uuid4().hex[:8]}:")
    v.lease_s = 0.2
    yield v
    keys = list(v.r.scan_iter(f"{v.prefix}*"))
    if keys:
        v.r.delete(*keys)


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_a_lost_replicas_runs_end_in_a_sweep_though_nobody_reads_them(view, kind, monkeypatch):
    """They said "running" (and a drain listed them) until a GetRun read each one, for the retention."""
    import time

    tree = view if kind == "redis" else MemoryTreeView()
    tree.lease_s = 0.2
    for run_id, status, replica in [("a", "running", "dead"), ("h", "queued", "dead"),
                                    ("b", "running", "live"), ("d", "done", "dead"), ("q", "queued", "")]:
        tree.put_run(run_id, status=status, replica=replica)
    tree.beat("dead")
    time.sleep(0.3)
    tree.beat("live")
    scans = []
    running_on = tree.running_on
    monkeypatch.setattr(tree, "running_on", lambda rs: scans.append(set(rs)) or running_on(rs))
    swept: dict[str, str] = {}
    assert sorted(sweep_lost(tree, swept)) == ["a", "h"]
    assert [tree.get_run(r)["status"] for r in "ahbdq"] == ["failed", "failed", "running", "done", "queued"]
    a = tree.get_run("a")
    assert a["result"]["lost"] and "replica dead stopped answering" in a["message"]
    assert sweep_lost(tree, swept) == [] and scans == [{"dead"}]  # once per lapse, not every sweep
    tree.put_run("a2", status="running", replica="dead")  # it came back, took a run, and lapsed again
    tree.beat("dead")
    time.sleep(0.3)
    tree.beat("live")
    assert sweep_lost(tree, swept) == ["a2"] and scans == [{"dead"}, {"dead"}]


def test_the_coordinators_sweep_survives_errors_and_lease_lapsed_reads_one_replica(view, monkeypatch):
    calls = []

    def flaky(tree, swept):
        calls.append(1)
        if len(calls) == 1:
            raise run_records.StoreUnavailable("down")
        return []

    monkeypatch.setattr(coordinator_mod, "sweep_lost", flaky)
    co = coordinator(view, None)
    co._sweep(every_s=0.01, rounds=2)
    assert len(calls) == 2
    view.put_run("r", status="running", replica="r0")
    view.beat("r0")
    assert not lease_lapsed(view, "r", "r0") and not lease_lapsed(view, "nope", "r0")
    import time

    time.sleep(0.3)
    assert lease_lapsed(view, "r", "r0") and not lease_lapsed(view, "r", "r1")
