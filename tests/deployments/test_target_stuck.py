"""A Target replica whose engine is stuck refuses a run with UNAVAILABLE naming itself, and the Coordinator
tries the run on another replica (no Ray: the Target's real ``run``, a stand-in handle for the replicas)."""

from __future__ import annotations

import grpc
import pytest
import torch
from test_coordinator_grpc import PROBLEM, SHORT, Handle, _run, coordinator, pb2, served

from gambit.deployments.run_records import ended_result
from gambit.deployments.target import Target
from gambit.serving.run_lease import Progress
from gambit.serving.tree_view import MemoryTreeView


def test_a_stuck_targets_run_is_an_unavailable_refusal_naming_it():
    """Its run was queued behind the stuck step: no "started", no error, so nothing ended it."""
    from gambit.serving.embedded import EmbeddedConfig, build_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    svc = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-wedged")
    now = [0.0]
    svc.progress = Progress(stuck_s=1.0, clock=lambda: now[0])
    svc.progress.busy()
    now[0] = 5.0  # one piece of work running for 5 s, over stuck_s
    me = object.__new__(Target.func_or_class)
    me.svc, me.replica, me.loop = svc, "r-wedged", None

    async def go():
        return [d async for d in me.run("stuck-run", PROBLEM, dict(SHORT))]

    try:
        got = _run(go(), timeout_s=5)  # old code: admitted (a wedged engine: queued)
    finally:
        svc.close()
        torch.set_num_threads(threads)
    assert len(got) == 1 and (got[0]["kind"], got[0]["code"], got[0]["replica"]) == \
        ("error", "UNAVAILABLE", "r-wedged"), got


@pytest.mark.parametrize("replicas, code", [(2, None), (1, grpc.StatusCode.UNAVAILABLE)])
def test_the_coordinator_tries_a_run_a_stuck_replica_refused_on_another(replicas, code):
    """An UNAVAILABLE refusal from a replica went to the client at once, though another replica could run
    it; with one replica the client gets UNAVAILABLE (retryable) and the run's id is free again."""

    async def target(run_id, problem, cfg, resume=False):
        if len(handle.calls) == 1:
            yield {"kind": "error", "code": "UNAVAILABLE", "message": "engine stuck", "replica": "r0"}
            return
        yield {"kind": "started", "run_id": run_id, "replica": "r1", "resumed": False, "restored": False}
        yield ended_result(run_id, "done", "")

    handle = Handle(target)
    tree = MemoryTreeView()
    co = coordinator(tree, handle)
    co.target_replicas = replicas

    async def go():
        async with served(co) as stub:
            req = pb2.SolveRequest(problem=PROBLEM, run_id="stuck-elsewhere", **SHORT)
            try:
                return [ev async for ev in stub.Solve(req, timeout=10)], None
            except grpc.aio.AioRpcError as e:
                return [], e

    events, err = _run(go(), timeout_s=8)
    if code is None:
        assert err is None and events[-1].result.status == "done", err
        assert [k.get("avoid", ()) for k in handle.calls] == [(), ("r0",)]
    else:
        assert err.code() == code and "engine stuck" in err.details()
        assert len(handle.calls) == 1 and tree.get_run("stuck-elsewhere") is None
