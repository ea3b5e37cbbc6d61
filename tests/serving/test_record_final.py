"""A run's final record is never written over by a replica that held it: one stuck or cut off that recovers
after its run was ended as failed (lost), or cancelled for it, or taken over and ended elsewhere. Views in
memory and in the real Redis (a prefix of its own, deleted after)."""

import pytest
from serving_util import tree_views

from gambit.deployments.run_records import end_if_lost, flag_cancel
from gambit.search.store import MemoryStore, RunUpdate
from gambit.serving.record_writer import InlineRecords, RecordWriter


@pytest.fixture(params=["memory", "redis"])
def tree(request):
    yield from tree_views(request.param, "test-final")


def _lost(tree, run_id: str) -> dict:
    """The run held by A, whose lease lapsed: ended as failed (lost) by a Coordinator's read."""
    tree.put_run(run_id, status="running", replica="A")
    tree.beat("A")
    tree.lease_s = 0.0
    rec = end_if_lost(tree, run_id, tree.get_run(run_id))
    assert rec["status"] == "failed" and rec["result"]["lost"]
    return tree.get_run(run_id)


def test_a_recovered_replica_never_writes_over_its_runs_failed_lost_record(tree):
    """Before: the record still named A, so A's progress and result went over the failed (lost) end."""
    before = _lost(tree, "t")
    refused = tree.put_runs_held([("t", {"status": "running", "replica": "A", "progress": {"round": 9}}),
                                  ("t", {"status": "done", "replica": "A", "result": {"answer": "42"}})])
    assert refused == {"t": "ended:failed"}
    assert tree.get_run("t") == before


def test_a_cancel_for_a_lost_replica_and_an_end_elsewhere_stay_final(tree):
    tree.put_run("c", status="running", replica="A")
    flag_cancel(tree, "c", lost="A")  # its client left while A was thought lost
    tree.put_run("b", status="done", replica="B", result={"answer": "7"})  # taken over, B finished it
    tree.put_run("own", status="running", replica="A")
    refused = tree.put_runs_held([("c", {"status": "done", "replica": "A"}),
                                  ("b", {"status": "failed", "replica": "A"}),
                                  ("own", {"status": "done", "replica": "A"})])
    assert refused == {"c": "ended:cancelled", "b": "B"}
    assert tree.get_run("c")["status"] == "cancelled" and tree.get_run("b")["result"] == {"answer": "7"}
    assert tree.get_run("own")["status"] == "done"


@pytest.mark.parametrize("inline", [False, True])
def test_the_writer_stops_a_run_whose_record_ended_and_drops_its_later_writes(tree, inline):
    store, lost = MemoryStore(), []
    w = (InlineRecords if inline else RecordWriter)(store, tree, on_lost=lambda r, h: lost.append((r, h)))
    before = _lost(tree, "t")
    w.put_held("t", status="running", replica="A", progress={"round": 4})
    assert w.flush(5)
    w.update("t", RunUpdate(meta={"round": 5}))  # its trace tree is not written either
    w.put_held("t", status="done", replica="A", result={"answer": "42"})
    assert w.flush(5)
    assert lost == [("t", "ended:failed")] and tree.get_run("t") == before and store.load("t") is None
    w.close()


def test_a_coordinators_failed_end_never_goes_over_a_result(tree):
    """Before: a stream that broke after its Target wrote the result (``end_lost``) wrote failed over it."""
    from gambit.deployments.run_records import end_failed, end_lost

    tree.put_run("d", status="done", replica="A", result={"answer": "42"})
    end_lost(tree, "d", RuntimeError("gone"))
    assert tree.get_run("d")["status"] == "done" and tree.get_run("d")["result"] == {"answer": "42"}
    tree.put_run("r", status="running", replica="A")
    tree.put_run("q", status="queued")
    assert end_failed(tree, "r", "broke", 1.0) and end_failed(tree, "q", "broke", 1.0)
    assert end_failed(tree, "none", "broke", 1.0)
    assert [tree.get_run(r)["status"] for r in ("r", "q", "none")] == ["failed"] * 3
