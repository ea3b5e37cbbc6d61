"""A Target's writes of the runs it holds are conditional (``put_held``): a replica that was stuck, or cut
off from Redis, and recovers after its run was taken over must not write over the new replica's record
nor its trace tree. Views in memory and in the real Redis (a prefix of its own, deleted after)."""

import threading
import uuid

import pytest
from serving_util import tree_views

from gambit.search.store import MemoryStore, RunUpdate
from gambit.serving.record_writer import InlineRecords, RecordWriter


@pytest.fixture(params=["memory", "redis"])
def tree(request):
    yield from tree_views(request.param, "test-held")


def test_held_writes_never_go_over_another_replicas_record(tree):
    tree.put_run("t", status="running", replica="B")  # taken over by B
    tree.put_run("mine", status="running", replica="A")
    tree.put_run("q", status="queued")  # no replica named: A's write goes in
    tree.request_cancel("mine")
    refused = tree.put_runs_held([("t", {"status": "done", "replica": "A"}),
                                  ("mine", {"status": "done", "replica": "A", "progress": {"round": 2}}),
                                  ("q", {"status": "running", "replica": "A"}),
                                  ("new", {"status": "running", "replica": "A"})])
    assert refused == {"t": "B"}
    assert (tree.get_run("t")["status"], tree.get_run("t")["replica"]) == ("running", "B")
    assert tree.get_run("mine")["progress"] == {"round": 2} and tree.get_run("mine")["status"] == "done"
    assert tree.cancel_requested(["mine"]) == {}  # ended: its flag went, as put_run does
    assert tree.get_run("q")["replica"] == "A" and tree.get_run("new")["replica"] == "A"
    assert tree.holders(["t", "mine", "nope"]) == {"t": "B", "mine": "A"}
    assert tree.put_runs_held([]) == {}


def test_the_views_say_every_beat_publicly(tree):
    tree.beat("r1")
    beats, now = tree.beats()
    assert set(beats) >= {"r1"} and 0 <= now - float(beats["r1"]) < 5


class _Store(MemoryStore):
    """A memory tree store that counts the updates it got per run."""

    def __init__(self) -> None:
        super().__init__()
        self.got: list[str] = []

    def update(self, run_id, up) -> None:
        self.got.append(run_id)
        super().update(run_id, up)


@pytest.mark.parametrize("inline", [False, True])
def test_a_refused_write_marks_the_run_lost_and_drops_its_later_writes(tree, inline):
    """Before: the old replica's progress and result were plain writes over the takeover's record."""
    store, lost = _Store(), []
    w = (InlineRecords if inline else RecordWriter)(store, tree, on_lost=lambda r, h: lost.append((r, h)))
    tree.put_run("t", status="running", replica="B")
    w.put_held("t", status="running", replica="A", progress={"round": 4})
    assert w.flush(5)
    rec = tree.get_run("t")
    assert lost == [("t", "B")] and rec["replica"] == "B" and "progress" not in rec
    w.update("t", RunUpdate(meta={"round": 5}))  # its next round's tree write: not over B's tree
    w.put_held("t", status="cancelled", replica="A", result={"answer": ""})
    assert w.flush(5)
    assert store.got == [] and tree.get_run("t")["status"] == "running" and lost == [("t", "B")]
    w.put_run("t", status="running", replica="A")  # admitted here again (a second takeover): held again
    w.update("t", RunUpdate(meta={"round": 6}))
    assert w.flush(5)
    assert store.got == ["t"] and tree.get_run("t")["replica"] == "A"
    w.close()


def test_while_suspect_the_tree_writes_of_a_run_taken_over_are_dropped_before_any_record_write(tree):
    """The round a stuck step ends with: its tree write was queued before its progress write was
    refused, so it went over the takeover's tree."""
    store, lost = _Store(), []
    w = RecordWriter(store, tree, on_lost=lambda r, h: lost.append((r, h)))
    tree.put_run("t", status="running", replica="B")
    tree.put_run("k", status="running", replica="A")
    w.suspect = "A"
    w.update("t", RunUpdate(meta={"round": 5}))
    w.update("k", RunUpdate(meta={"round": 5}))
    assert w.flush(5)
    assert store.got == ["k"] and lost == [("t", "B")]
    w.close()


def test_held_writes_share_the_transaction_of_tree_writes_in_one_redis():
    from gambit.search.redis_store import RedisStore
    from gambit.serving.tree_view import RedisTreeView

    prefix = f"test-held-{uuid.uuid4().hex[:8]}"
    store, tree = RedisStore(prefix=prefix + "tree"), RedisTreeView(prefix=prefix + ":")
    lost = []
    w = RecordWriter(store, tree, on_lost=lambda r, h: lost.append((r, h)))
    go = threading.Event()
    try:
        tree.put_run("t", status="running", replica="B")
        w.after(lambda: go.wait(5))  # holds the writer: the next writes queue up as one batch
        w.update("k", RunUpdate(meta={"step": 3}))
        w.put_held("k", status="running", replica="A")
        w.put_held("t", status="done", replica="A")
        w.put_run("j", status="running", replica="A")
        go.set()
        assert w.flush(5)
        assert w._shared and w.batches == 1 and lost == [("t", "B")]
        assert tree.holders(["k", "t", "j"]) == {"k": "A", "t": "B", "j": "A"}
        assert store.load("k")["meta"]["step"] == 3 and tree.get_run("t")["status"] == "running"
    finally:
        w.close()
        store.clear()
        for k in tree.r.scan_iter(f"{prefix}:*"):
            tree.r.delete(k)
