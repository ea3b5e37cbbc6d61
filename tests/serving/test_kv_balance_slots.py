"""Batch slots in the KV-aware placement of runs (stop 67): a replica where the run launches at once
ranks before one whose batch is full (the Target would hold the run there, queued); replicas that do
not report their batch rank as before."""

from __future__ import annotations

import asyncio
import time
from collections import namedtuple
from types import SimpleNamespace

from gambit.serving.kv_balance import ReplicaLoad, rank


def L(name, num, reserved, runs, seqs=0, slots=0):  # noqa: N802 — short test helper
    return ReplicaLoad(name, num, reserved, runs, 16, 2048, seqs, slots)


def test_a_replica_where_the_run_launches_now_ranks_before_one_that_would_hold_it():
    """Ranked by KV alone, ``roomy`` (the most KV free) came first though its 8 slots were taken: the
    run of C 4 would wait held there while ``slots`` could launch it at once."""
    loads = [L("roomy", 1000, 100, 2, seqs=8, slots=8), L("slots", 1000, 400, 1, seqs=8, slots=4)]
    need = {x.replica: 100 for x in loads}
    assert rank(loads, need) == [["roomy"], ["slots"]]  # no capacity: KV alone, as before
    assert rank(loads, need, capacity=4) == [["slots"], ["roomy"]]
    assert rank(loads, need, capacity=5) == [["roomy"], ["slots"]]  # neither launches it: KV order
    # C above the batch takes it whole: launches only where nothing is in the batch
    assert rank([*loads, L("empty", 1000, 600, 0, seqs=8)], {**need, "empty": 100}, capacity=64) == [
        ["empty"], ["roomy"], ["slots"]]


def test_held_runs_leave_no_slot_and_unreported_replicas_rank_between():
    # 4 launched + 8 held on 8 slots: a run of C 1 would wait behind the held one (first come)
    held = L("held", 1000, 0, 3, seqs=8, slots=12)
    assert not held.launches(1) and L("x", 10, 0, 0, seqs=8, slots=7).launches(1)
    loads = [held, L("busy", 1000, 500, 1, seqs=8, slots=6), L("kvfull", 1000, 990, 1, seqs=8)]
    need = {x.replica: 100 for x in loads}
    assert rank(loads, need, unknown=["new"], capacity=2) == [["busy"], ["new"], ["held"], ["kvfull"]]
    assert rank(loads, need, unknown=["new"], avoid=("busy",), capacity=2) == [["new"], ["held"], ["kvfull"]]


def test_replicas_without_slot_stats_rank_as_before():
    """A replica of before stop 67 reports no ``max_num_seqs``: it counts as launching, so a fleet of
    them ranks by KV as it did, and one of them keeps its KV place among new ones."""
    old = [L("a", 1000, 400, 5), L("b", 200, 0, 0), L("c", 600, 300, 1)]
    need = {x.replica: 100 for x in old}
    assert rank(old, need, capacity=8) == rank(old, need) == [["b"], ["a"], ["c"]]
    mixed = [*old, L("full", 1000, 0, 2, seqs=8, slots=8)]
    assert rank(mixed, {**need, "full": 100}, capacity=8) == [["b"], ["a"], ["c"], ["full"]]
    stats = {"num_blocks": 600, "reserved_blocks": 0, "runs": 0, "stamp": 1.0}
    assert ReplicaLoad.from_stats("r", stats) == ReplicaLoad("r", 600, 0, 0)
    got = ReplicaLoad.from_stats("r", {**stats, "max_num_seqs": 8, "batch_slots": 12})
    assert (got.max_num_seqs, got.batch_slots) == (8, 12)
    assert ReplicaLoad.from_stats("r", {**stats, "batch_slots": "x"}) is None
    assert ReplicaLoad.from_stats("r", {**stats, "batch_slots": -1}) is None


# -- the Serve router (Serve's own objects replaced by plain stand-ins, as in test_kv_balance) --------
Rid = namedtuple("Rid", "unique_id")


def _replica(name, stats):
    return SimpleNamespace(replica_id=Rid(name), routing_stats=stats)


def _stats(reserved, slots, stamp, seqs=8):
    return {"num_blocks": 1000, "reserved_blocks": reserved, "runs": 1, "block_size": 16,
            "max_model_len": 2048, "max_num_seqs": seqs, "batch_slots": slots, "stamp": stamp}


def test_router_counts_the_slots_of_runs_it_routed_since_a_report():
    from gambit.deployments.kv_router import KVAwareRouter

    router = KVAwareRouter.__new__(KVAwareRouter)
    router.initialize_state()
    now = time.time() - 0.5
    a, b = _replica("a", _stats(0, 4, now)), _replica("b", _stats(300, 0, now))
    router._replicas = {x.replica_id: x for x in (a, b)}
    req = SimpleNamespace(metadata=SimpleNamespace(call_method="run"),
                          args=["rid", "x" * 20, {"capacity": 4, "max_tokens": 300}], kwargs={})

    def order():
        return [g[0].replica_id.unique_id for g in asyncio.run(router.choose_replicas([a, b], req))]

    assert order() == ["a", "b"]  # a: more KV free, and 4 of 8 slots
    router.on_request_routed(req, a.replica_id, None)  # a's slots are taken now: 4 + 4
    assert {x.replica: x.batch_slots for x in router.loads([a, b])[0]} == {"a": 8, "b": 0}
    assert order() == ["b", "a"]
    a.routing_stats = _stats(168, 8, time.time() + 0.01)  # its report covers it: not counted twice
    assert {x.replica: x.batch_slots for x in router.loads([a, b])[0]} == {"a": 8, "b": 0}
    # replicas of before stop 67 (no slots reported): by KV, as before
    a.routing_stats, b.routing_stats = _stats(0, 8, time.time(), seqs=0), _stats(300, 0, time.time(), seqs=0)
    assert order() == ["a", "b"]
