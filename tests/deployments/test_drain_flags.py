"""``gambit serve``'s stop (``drain``) on the in-memory tree view: no Ray, no Redis."""

from __future__ import annotations

from gambit.deployments import drain
from gambit.serving.tree_view import CANCELLED_BY_RPC, MemoryTreeView


def test_a_drain_keeps_the_reason_of_a_run_being_cancelled_already(monkeypatch):
    """A run its client had cancelled (CancelRun's flag not yet read by its Target) was re-flagged
    SHUTTING_DOWN: its Result told the client to "retry with a new run_id" a run it had cancelled. A
    second drain (a second stop signal) flags nothing again and still returns the runs it waits for."""
    monkeypatch.setattr(drain, "RELAY_S", 0.0)
    tree = MemoryTreeView()
    for run_id, replica in [("mine", "r0"), ("cancelled", "r0"), ("elsewhere", "r9")]:
        tree.put_run(run_id, status="running", replica=replica)
    tree.request_cancel("cancelled")
    assert sorted(drain.drain(tree, {"r0"}, wait_s=0.05)) == ["cancelled", "mine"]
    assert tree.cancel_requested(["mine", "cancelled", "elsewhere"]) == {
        "mine": drain.SHUTTING_DOWN, "cancelled": CANCELLED_BY_RPC}
    assert sorted(drain.drain(tree, {"r0"}, wait_s=0.05)) == ["cancelled", "mine"]
    assert tree.cancel_requested(["mine", "cancelled"])["cancelled"] == CANCELLED_BY_RPC
    tree.put_run("mine", status="cancelled")
    assert drain.drain(tree, {"r0"}, wait_s=0.05) == ["cancelled"]  # an ended run is not waited for
    assert drain.drain(tree, set(), wait_s=5.0) == []


def test_a_redis_blip_while_waiting_does_not_end_the_drain(monkeypatch):
    """A StoreUnavailable in the wait raised out of the drain: `gambit serve` said "not drained" and shut
    Serve down at once, the cancelled runs' Results still on their way to the clients."""
    from gambit.serving.tree_view import StoreUnavailable

    monkeypatch.setattr(drain, "RELAY_S", 0.0)
    tree = MemoryTreeView()
    tree.put_run("r", status="running", replica="r0")
    get_run, blips = tree.get_run, [1, 1]

    def flaky(run_id):
        if blips:
            blips.pop()
            tree.put_run("r", status="cancelled")  # the Target ends it meanwhile
            raise StoreUnavailable("tree store (Redis) unreachable")
        return get_run(run_id)

    monkeypatch.setattr(tree, "get_run", flaky)
    assert drain.drain(tree, {"r0"}, wait_s=2.0) == ["r"] and not blips
