"""KV-aware placement of runs on Target replicas: the ranking, the need estimate, the Serve router's
use of the replicas' reports, and the Coordinator's retry on the replicas that have not refused."""

from __future__ import annotations

import asyncio
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest

from gambit.serving.kv_balance import ReplicaLoad, estimate_need, rank


def L(name, num, reserved, runs, block_size=16, max_len=2048):  # noqa: N802 — short test helper
    return ReplicaLoad(name, num, reserved, runs, block_size, max_len)


def test_estimate_need_is_capacity_times_blocks_of_prompt_plus_max_tokens():
    load = L("a", 1000, 0, 0, block_size=16, max_len=2048)
    # 20 bytes + BOS + 300 tokens = 321 tokens -> 21 blocks of 16, x8 traces
    assert estimate_need("x" * 20, 8, 300, load) == 8 * 21
    assert estimate_need("é" * 10, 1, 10, load) == 2  # 20 UTF-8 bytes + 1 + 10 = 31 tokens
    # a trace never needs more than the context
    assert estimate_need("x" * 100, 2, 5000, L("b", 1000, 0, 0, 16, 512)) == 2 * 32


def test_rank_prefers_the_most_free_kv_after_the_run_not_the_fewest_runs():
    loads = [L("busy-but-big", 1000, 400, 5), L("idle-small", 200, 0, 0), L("half", 600, 300, 1)]
    need = {x.replica: 100 for x in loads}
    # free after the run: 500/1000 = 0.5, 100/200 = 0.5, 200/600 = 0.33; ties go to fewer runs
    assert rank(loads, need) == [["idle-small"], ["busy-but-big"], ["half"]]
    need["idle-small"] = 150  # 50/200 = 0.25 left: now last of those that fit
    assert rank(loads, need) == [["busy-but-big"], ["half"], ["idle-small"]]


def test_replicas_that_cannot_hold_the_run_come_after_those_that_can_and_unreported():
    loads = [L("full", 100, 90, 3), L("fits", 100, 50, 9), L("nearly", 100, 70, 1)]
    need = {"full": 40, "fits": 40, "nearly": 40}
    assert rank(loads, need, unknown=["new"]) == [["fits"], ["new"], ["nearly"], ["full"]]


def test_avoided_replicas_are_left_out_until_nothing_else_is_left():
    loads = [L("a", 100, 0, 0), L("b", 100, 50, 0)]
    need = {"a": 10, "b": 10}
    assert rank(loads, need, avoid=("a",)) == [["b"]]
    assert rank(loads, need, unknown=["c"], avoid=("a", "b", "c")) == [["a"], ["b"], ["c"]]


def test_replica_load_checks_and_reads_stats():
    assert L("a", 100, 130, 1).free_blocks == 0
    with pytest.raises(ValueError, match="num_blocks"):
        L("a", 0, 0, 0)
    with pytest.raises(ValueError, match="reserved_blocks"):
        L("a", 10, -1, 0)
    got = ReplicaLoad.from_stats("r", {"num_blocks": 600, "reserved_blocks": 120, "runs": 2, "block_size": 16,
                                       "max_model_len": 1024, "stamp": 1.0})
    assert got == L("r", 600, 120, 2, 16, 1024)
    assert ReplicaLoad.from_stats("r", {}) is None
    assert ReplicaLoad.from_stats("r", {"num_blocks": "x", "reserved_blocks": 0, "runs": 0}) is None


# -- the Serve router over replicas' reports (Serve's own objects replaced by plain stand-ins) ---------
Rid = namedtuple("Rid", "unique_id")  # Serve's ReplicaID: hashable, with unique_id


def _replica(name, stats):
    return SimpleNamespace(replica_id=Rid(name), routing_stats=stats)


def _run_request(problem, capacity, max_tokens, avoid=()):
    cfg = {"capacity": capacity, "max_tokens": max_tokens}
    return SimpleNamespace(metadata=SimpleNamespace(call_method="run"), args=["rid", problem, cfg],
                           kwargs={"avoid": avoid} if avoid else {})


def _router():
    from gambit.deployments.kv_router import KVAwareRouter

    r = KVAwareRouter.__new__(KVAwareRouter)  # Serve builds it with its own plumbing; only state here
    r.initialize_state()
    return r


def _stats(num, reserved, runs, stamp):
    return {"num_blocks": num, "reserved_blocks": reserved, "runs": runs, "block_size": 16,
            "max_model_len": 2048, "stamp": stamp}


def test_router_ranks_by_reported_kv_plus_what_it_routed_since():
    router = _router()
    now = time.time()
    a, b = _replica("a", _stats(1000, 100, 1, now - 0.5)), _replica("b", _stats(1000, 300, 0, now - 0.5))
    router._replicas = {x.replica_id: x for x in (a, b)}
    req = _run_request("x" * 20, 8, 300)  # needs 168 blocks
    got = asyncio.run(router.choose_replicas([a, b], req))
    assert [[x.replica_id.unique_id for x in g] for g in got] == [["a"], ["b"]]
    # three runs routed to a since its report: 100 + 3 x 168 = 604 reserved > b's 300
    for _ in range(3):
        router.on_request_routed(req, a.replica_id, None)
    loads, unknown = router.loads([a, b])
    assert {x.replica: (x.reserved_blocks, x.runs) for x in loads} == {"a": (604, 4), "b": (300, 0)}
    got = asyncio.run(router.choose_replicas([a, b], req))
    assert [g[0].replica_id.unique_id for g in got] == ["b", "a"]
    # a's next report covers them: they are not counted twice
    a.routing_stats = _stats(1000, 604, 4, time.time() + 0.01)
    assert {x.replica: x.reserved_blocks for x in router.loads([a, b])[0]} == {"a": 604, "b": 300}
    assert router.routed["a"] == []


def test_router_honours_avoid_and_leaves_other_calls_to_any_replica():
    router = _router()
    a, b = _replica("a", _stats(1000, 0, 0, 1.0)), _replica("b", _stats(1000, 500, 0, 1.0))
    got = asyncio.run(router.choose_replicas([a, b], _run_request("x", 1, 10, avoid=("a",))))
    assert [[x.replica_id.unique_id for x in g] for g in got] == [["b"]]
    load_call = SimpleNamespace(metadata=SimpleNamespace(call_method="load"), args=[], kwargs={})
    assert asyncio.run(router.choose_replicas([a, b], load_call)) == [[a, b]]
    c = _replica("c", {})  # started, not reported yet: after those that fit
    got = asyncio.run(router.choose_replicas([a, b, c], _run_request("x", 1, 10)))
    assert [g[0].replica_id.unique_id for g in got] == ["a", "b", "c"]


def test_coordinator_tries_each_replica_once_before_resource_exhausted():
    pytest.importorskip("ray.serve")
    from gambit.deployments.coordinator import Call

    refusal = {"kind": "error", "code": "RESOURCE_EXHAUSTED", "message": "KV", "replica": "r1"}
    call = Call(0.0)
    assert call.try_elsewhere(refusal, replicas=3) and call.avoid == ("r1",)
    assert not call.try_elsewhere(refusal, replicas=3)  # r1 again: the router had nothing else
    assert call.try_elsewhere({**refusal, "replica": "r2"}, replicas=3) and call.avoid == ("r1", "r2")
    assert not call.try_elsewhere({**refusal, "replica": "r3"}, replicas=3)  # all three refused
    assert not Call(0.0).try_elsewhere(refusal, replicas=1)  # one replica: refused at once
    assert not Call(0.0).try_elsewhere({**refusal, "code": "INVALID_ARGUMENT"}, replicas=3)


def test_estimate_need_takes_a_problem_with_a_lone_surrogate():
    """``problem.encode()`` raised UnicodeEncodeError on a lone surrogate (JSON "\\ud800" decodes to one):
    the router failed where the Target answers INVALID_ARGUMENT. Counted as its 3 bytes: still a bound."""
    load = ReplicaLoad("r", num_blocks=100, reserved_blocks=0, runs=0, block_size=16, max_model_len=2048)
    assert estimate_need("a\ud800b", 2, 10, load) == 2 * -(-(1 + 3 + 1 + 1 + 10) // 16)
