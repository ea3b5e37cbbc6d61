"""Two Target replicas behind one Coordinator, live: a second Serve application ("gambit2") in the
session's Ray, with a KV cache per replica that holds two runs but not three. Runs are pinned to the
replica that started them, spread by KV load, and refused only when no replica has room."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from test_serve import LONG, PROBLEMS, pb2, pb2_grpc

from gambit.deployments.kv_router import STATS_PERIOD_S

pytestmark = pytest.mark.slow
APP = "gambit2"
NUM_BLOCKS = 150  # per replica; a run of C = 4 and 240 tokens reserves 4 x 18 = 72 (two fit, not three)
RUN = dict(capacity=4, swap=1, round_interval=8, max_tokens=240)


def md():
    return (("authorization", f"Bearer {os.environ['GAMBIT_TEST_SERVE_TOKEN']}"), ("application", APP))


@pytest.fixture(scope="module")
def two(serve_stack):
    from ray import serve

    from gambit.deployments import local
    from gambit.deployments.app import build_gambit

    args = serve_stack["cfg"].app_args() | {"target_replicas": 2, "coordinator_replicas": 1,
                                            "prefix": serve_stack["prefix"] + "two:"}
    args["target"] = dict(args["target"], num_blocks=NUM_BLOCKS)
    serve.run(build_gambit(args), name=APP, route_prefix=f"/{APP}", blocking=False)
    local.wait_ready(serve_stack["address"], 300, os.environ["GAMBIT_TEST_SERVE_TOKEN"], application=APP)
    deadline = time.monotonic() + 300

    def targets_running() -> int:
        app = serve.status().applications.get(APP)
        dep = app.deployments.get("Target") if app is not None else None
        return dep.replica_states.get("RUNNING", 0) if dep is not None else 0

    while targets_running() < 2:  # the Coordinator answers before both Targets are up
        assert time.monotonic() < deadline, "two Target replicas never ran"
        time.sleep(0.5)
    time.sleep(3 * STATS_PERIOD_S + 1)  # both replicas' KV reports have reached the router
    try:
        yield pb2_grpc.ReasoningServiceStub(grpc.insecure_channel(serve_stack["address"]))
    finally:
        serve.delete(APP)


def started(call):
    first = next(call)
    assert first.WhichOneof("event") == "started"
    return first.started


def test_runs_spread_by_kv_load_and_stay_pinned(two):
    # a long run holds one replica's KV; the next run goes to the other replica (most free KV)
    a = two.Solve(pb2.SolveRequest(problem=LONG, seed=1, **RUN), metadata=md(), timeout=240)
    sa = started(a)
    b = two.Solve(pb2.SolveRequest(problem=PROBLEMS[0], seed=2, **RUN), metadata=md(), timeout=240)
    sb = started(b)
    events_a, events_b = list(a), list(b)
    assert events_a[-1].result.status == "done" and events_b[-1].result.status == "done"
    assert sb.replica != sa.replica
    # pinned: each run's record names the replica that started it, and no run was taken over
    for s in (sa, sb):
        info = two.GetRun(pb2.GetRunRequest(run_id=s.run_id), metadata=md(), timeout=30)
        assert info.status == "done" and info.replica == s.replica and not s.resumed
    # four at once: two per replica fit, three on one do not; none is refused while room is left
    calls = [two.Solve(pb2.SolveRequest(problem=PROBLEMS[i % len(PROBLEMS)], seed=10 + i, **RUN),
                       metadata=md(), timeout=240) for i in range(4)]
    starts = [started(c) for c in calls]
    results = [list(c)[-1].result for c in calls]
    assert all(r.status == "done" for r in results)
    assert len({s.replica for s in starts}) == 2
