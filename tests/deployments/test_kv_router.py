"""The Target's request router inside Serve's own routing loop (no Ray cluster: replicas are stand-ins
with a queue length in the router's cache, so no probe is sent)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import namedtuple
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve")
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402

from gambit.deployments.kv_router import KVAwareRouter  # noqa: E402

Rid = namedtuple("Rid", "unique_id")  # Serve's ReplicaID: hashable, with unique_id


def _stats(reserved=0, runs=0, stamp=None, num=1000):
    return {"num_blocks": num, "reserved_blocks": reserved, "runs": runs, "block_size": 16,
            "max_model_len": 2048, "max_num_seqs": 64, "batch_slots": 0,
            "stamp": time.time() - 0.5 if stamp is None else stamp}


def _replica(name, stats):
    return SimpleNamespace(replica_id=Rid(name), routing_stats=stats, max_ongoing_requests=64)


def _router(replicas):
    r = KVAwareRouter(DeploymentID(name="Target", app_name="gambit"), DeploymentHandleSource.UNKNOWN,
                      use_replica_queue_len_cache=True)
    r.initialize_state()
    r._replicas = {x.replica_id: x for x in replicas}
    r._replicas_list = list(replicas)
    for x in replicas:
        r._replica_queue_len_cache.update(x.replica_id, 0)
    return r


def _run(problem="x" * 20, capacity=4, max_tokens=300, avoid=()):
    md = RequestMetadata(request_id="r", internal_request_id=uuid.uuid4().hex, call_method="run")
    return PendingRequest(args=["run-id", problem, {"capacity": capacity, "max_tokens": max_tokens}],
                          kwargs={"avoid": avoid} if avoid else {}, metadata=md)


def test_a_burst_of_runs_spreads_over_tied_replicas():
    """Runs assigned before any replica accepted one (a round trip each) all went to replica a."""
    replicas = [_replica(n, _stats()) for n in "abcd"]

    async def burst():
        router = _router(replicas)
        chosen = await asyncio.gather(*(router._choose_replica_for_request(_run()) for _ in range(4)))
        return sorted(x.replica_id.unique_id for x in chosen), router

    got, router = asyncio.run(burst())
    assert got == ["a", "b", "c", "d"]
    assert {rid: len(sent) for rid, sent in router.routed.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}


def test_the_replica_ranked_for_a_request_goes_to_that_request():
    """FIFOMixin handed it to the oldest pending request: B (which replica a refused) ranked b, yet
    b went to A, and A's pick, a, then went to B: refused again, RESOURCE_EXHAUSTED."""
    a, b = _replica("a", _stats()), _replica("b", _stats(reserved=500))
    router = _router([a, b])

    async def two_pending():
        first, second = _run(), _run(avoid=("a",))
        for pr in (first, second):
            router._pending_requests_to_fulfill.append(pr)
            router._add_pending_request_to_indices(pr)
        ranked = await router.choose_replicas([a, b], second)
        assert ranked[0] == [b]
        router._fulfill_next_pending_request(b, second.metadata)
        return first, second

    first, second = asyncio.run(two_pending())
    assert second.future.done() and second.future.result() is b
    assert not first.future.done()
    # counted once, though Serve calls on_request_routed when b accepts it
    router.on_request_routed(second, b.replica_id, None)
    assert len(router.routed["b"]) == 1


def test_a_vanished_replica_is_forgotten_and_garbage_never_raises():
    a, b, c = (_replica(n, _stats()) for n in "abc")
    router = _router([a, b, c])

    async def check():
        router.on_request_routed(_run(), c.replica_id, None)
        assert "c" in router.routed
        router.loads([a, b])  # c is gone (dead, scaled down): its list no longer kept
        assert set(router.routed) == {"a", "b"}
        # a report with a bad stamp, a request the ranking cannot read: a choice, not an exception
        # (raised in choose_replicas, Serve dropped the request and its caller waited for ever)
        a.routing_stats = {**_stats(), "stamp": "x"}
        assert len(await router.choose_replicas([a, b], _run())) == 2
        bad = _run()
        bad.args[2]["capacity"] = "four"
        assert await router.choose_replicas([a, b], bad) == [[a, b]]

    asyncio.run(check())


def test_many_replicas_rank_by_free_kv_and_a_run_no_replica_holds_goes_to_each_once():
    replicas = [_replica(f"r{i:02d}", _stats(reserved=10 * i)) for i in range(24)]
    router = _router(replicas)
    names = [f"r{i:02d}" for i in range(24)]

    async def order(**run):
        return [g[0].replica_id.unique_id for g in await router.choose_replicas(replicas, _run(**run))]

    async def check():
        assert await order() == names  # the most free KV first
        assert await order(capacity=64, max_tokens=2000) == names  # 64 x 127 blocks > any replica's 1000
        # all but one refused it: only that one is left to try, then RESOURCE_EXHAUSTED
        assert await order(capacity=64, max_tokens=2000, avoid=tuple(names[:-1])) == ["r23"]

    asyncio.run(check())
