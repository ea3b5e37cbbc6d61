"""The Target's record writer: Redis writes off the engine thread, in order, batched; callbacks after."""

import threading
import time
import uuid

import pytest

from gambit.search.store import RunUpdate
from gambit.serving.record_writer import InlineRecords, RecordWriter
from gambit.serving.tree_view import StoreUnavailable


class Slow:
    """A store and tree view that log writes, block while ``gate`` is clear and can be 'down'."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.down = False

    def update_many(self, items):
        self.gate.wait(5)
        if self.down:
            raise StoreUnavailable("Redis at x unreachable")
        self.batches.append(len(items))
        self.log += [("tree", r, up.meta["n"]) for r, up in items]

    def update(self, run_id, up):
        self.update_many([(run_id, up)])

    def put_run(self, run_id, **fields):
        self.put_runs([(run_id, fields)])

    def put_runs(self, items):
        if self.down:
            raise StoreUnavailable("Redis at x unreachable")
        self.log += [("run", r, f["n"]) for r, f in items]


def test_writes_keep_their_order_batch_up_and_callbacks_run_after_them():
    s = Slow()
    w = RecordWriter(s, s)
    s.gate.clear()  # the first write blocks: the next ones queue up behind it
    w.update("a", RunUpdate(meta={"n": 0}))
    time.sleep(0.05)
    seen = []
    for i in range(1, 6):
        w.update("a", RunUpdate(meta={"n": i}))
    w.put_run("a", n=6)
    w.after(lambda: seen.append(list(s.log)))
    t = time.perf_counter()
    w.update("b", RunUpdate(meta={"n": 7}))
    assert time.perf_counter() - t < 0.05  # the caller never waits for Redis
    s.gate.set()
    assert w.flush(5)
    assert [x[2] for x in s.log] == list(range(8))
    assert s.batches[:2] == [1, 5]  # what queued while a write was in flight went out as one
    assert len(seen) == 1 and seen[0][:7] == s.log[:7]  # it saw every write queued before it
    w.close()


def test_an_outage_defers_writes_but_not_callbacks_and_replays_them_in_order():
    s = Slow()
    s.down = True
    w = RecordWriter(s, s, retry_s=0.05)
    got = []
    w.update("a", RunUpdate(meta={"n": 0}))
    w.put_run("a", n=1)
    w.after(lambda: got.append("result"))
    assert w.flush(5) and got == ["result"] and s.log == []
    assert len(w.backlog) == 2
    s.down = False  # nothing else is written: the writer replays the backlog by itself
    deadline = time.monotonic() + 5
    while w.backlog and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [x[2] for x in s.log] == [0, 1] and not w.backlog
    w.update("a", RunUpdate(meta={"n": 2}))
    assert w.flush(5)
    assert [x[2] for x in s.log] == [0, 1, 2]
    w.close()


def test_inline_records_write_at_once_and_keep_failed_tree_writes():
    s = Slow()
    r = InlineRecords(s, s)
    s.down = True
    r.update("a", RunUpdate(meta={"n": 0}))
    r.put_run("a", n=1)  # a run record write is skipped while Redis is down
    s.down = False
    r.update("a", RunUpdate(meta={"n": 2}))
    assert s.log == [("tree", "a", 0), ("tree", "a", 2)]
    called = []
    r.after(lambda: called.append(1))
    assert called == [1]


@pytest.mark.parametrize("n", [1, 3])
def test_redis_batches_equal_single_writes(n):
    from gambit.search.redis_store import RedisStore
    from gambit.serving.tree_view import RedisTreeView

    prefix = f"test-rw-{uuid.uuid4().hex[:8]}"
    store, tree = RedisStore(prefix=prefix + "tree"), RedisTreeView(prefix=prefix + ":")
    try:
        ups = [(f"r{i % 2}", RunUpdate(meta={"step": i}, nodes=[{"id": i, "tokens": [i]}], rounds=[{"r": i}]))
               for i in range(n)]
        store.update_many(ups)
        tree.put_runs([(r, {"status": "running", "step": up.meta["step"]}) for r, up in ups])
        for rid in {r for r, _ in ups}:
            mine = [up for r, up in ups if r == rid]
            data = store.load(rid)
            assert data["meta"]["step"] == mine[-1].meta["step"]
            assert sorted(int(k) for k in data["nodes"]) == [up.nodes[0]["id"] for up in mine]
            assert [x["r"] for x in data["rounds"]] == [up.rounds[0]["r"] for up in mine]
            assert tree.get_run(rid)["step"] == mine[-1].meta["step"]
    finally:
        store.clear()
        for k in tree.r.scan_iter(f"{prefix}:*"):
            tree.r.delete(k)


def test_store_and_run_records_in_one_redis_go_out_as_one_transaction():
    from gambit.search.redis_store import RedisStore
    from gambit.serving.tree_view import RedisTreeView

    prefix = f"test-rw-{uuid.uuid4().hex[:8]}"
    store, tree = RedisStore(prefix=prefix + "tree"), RedisTreeView(prefix=prefix + ":")
    w = RecordWriter(store, tree)
    go = threading.Event()
    try:
        w.after(lambda: go.wait(5))  # holds the writer: the next two writes queue up together
        time.sleep(0.05)
        w.update("r1", RunUpdate(meta={"step": 3}, nodes=[{"id": 0, "tokens": [1, 2]}]))
        w.put_run("r1", status="done", result={"answer": "7"})
        go.set()
        assert w.flush(5)
        assert w.batches == 1 and w._shared
        assert store.load("r1")["meta"]["step"] == 3 and tree.get_run("r1")["result"] == {"answer": "7"}
    finally:
        w.close()
        store.clear()
        for k in tree.r.scan_iter(f"{prefix}:*"):
            tree.r.delete(k)
