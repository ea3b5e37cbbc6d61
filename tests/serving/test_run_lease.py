"""The liveness lease of the runs a Target replica holds (``run_lease``; the views' ``beat``/``stale_beat``):
in memory and in the real Redis (a prefix of its own, deleted after), and the TargetService that beats."""

import time
import uuid

import pytest
from serving_util import tree_views

from gambit.serving.run_lease import HEARTBEAT_S, LEASE_S
from gambit.serving.tree_view import RedisTreeView


@pytest.fixture(params=["memory", "redis"])
def tree(request):
    yield from tree_views(request.param, "test-lease")


def test_the_lease_is_three_beats():
    assert LEASE_S == 3 * HEARTBEAT_S


def test_a_run_is_lost_once_its_replica_stops_beating(tree):
    tree.lease_s = 0.3
    tree.put_run("a", status="running", replica="r1")
    tree.put_run("h", status="queued", replica="r1")  # held for batch slots: r1 holds it too
    tree.put_run("q", status="queued")  # no Target admitted it: no lease
    tree.put_run("d", status="done", replica="r1")
    tree.put_run("n", status="running", replica="never")  # a replica that never beat: not known lost
    tree.beat("r1")
    assert tree.stale_beat(tree.get_run("a")) is None  # alive
    time.sleep(0.5)
    beat = tree.stale_beat(tree.get_run("a"))
    assert beat is not None and 0.4 < time.time() - float(beat) < 30
    assert tree.stale_beat(tree.get_run("h")) == beat
    assert [tree.stale_beat(tree.get_run(r)) for r in ("q", "d", "n")] == [None, None, None]
    tree.beat("r1")  # alive again
    assert tree.stale_beat(tree.get_run("a")) is None


def test_a_lost_run_ends_only_while_its_replica_holds_it_and_has_not_beaten(tree):
    tree.lease_s = 0.2
    for r in ("a", "b", "c", "d"):
        tree.put_run(r, status="running", replica="r1")
    tree.beat("r1")
    time.sleep(0.3)
    beat = tree.stale_beat(tree.get_run("a"))
    assert beat is not None
    assert tree.put_run_if_lost("a", "r1", beat, status="failed", message="lost")
    assert tree.get_run("a")["status"] == "failed"
    tree.put_run("b", status="running", replica="r2")  # taken over meanwhile: the takeover's record stays
    assert not tree.put_run_if_lost("b", "r1", beat, status="failed")
    assert (tree.get_run("b")["status"], tree.get_run("b")["replica"]) == ("running", "r2")
    tree.put_run("c", status="done", replica="r1")  # ended by its replica meanwhile
    assert not tree.put_run_if_lost("c", "r1", beat, status="failed")
    assert tree.get_run("c")["status"] == "done"
    tree.beat("r1")  # its replica beat again: alive after all
    assert not tree.put_run_if_lost("d", "r1", beat, status="failed")
    assert tree.get_run("d")["status"] == "running"
    assert not tree.put_run_if_lost("nope", "r1", beat, status="failed") and tree.get_run("nope") is None


def test_a_redis_beat_is_one_key_per_replica_with_the_records_ttl():
    view = RedisTreeView(prefix=f"test-lease-{uuid.uuid4().hex[:8]}:", ttl_s=600)
    try:
        view.beat("r1")
        view.beat("r1")
        assert list(view.r.scan_iter(f"{view.prefix}*")) == [f"{view.prefix}alive:r1"]
        assert 590 < view.r.ttl(f"{view.prefix}alive:r1") <= 600
        assert abs(float(view.r.get(f"{view.prefix}alive:r1")) - time.time()) < 5
    finally:
        view.r.delete(f"{view.prefix}alive:r1")


# the engine thread is made to die on purpose: its exception is the point, not a leak
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_target_beats_while_its_engine_thread_lives(monkeypatch):
    """The runs of a replica whose engine thread is gone are lost: its process may live on, its runs
    never end (the beat is not on the engine thread: a long step is no death)."""
    import torch

    from gambit.serving import target_heartbeat
    from gambit.serving.embedded import EmbeddedConfig, build_target

    torch.set_num_threads(1)
    monkeypatch.setattr(target_heartbeat, "HEARTBEAT_S", 0.05)
    svc = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-beat")
    try:
        svc.tree.lease_s = 0.5
        held = {"status": "running", "replica": "r-beat"}
        deadline = time.monotonic() + 5
        while "r-beat" not in svc.tree._alive and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.7)  # longer than the lease: it beat meanwhile
        assert svc.tree.stale_beat(held) is None

        def broken():
            raise RuntimeError("engine thread died")

        monkeypatch.setattr(svc.driver, "has_work", broken)
        with svc._cv:
            svc._cv.notify_all()
        svc._thread.join(timeout=5)
        assert not svc._thread.is_alive()
        time.sleep(0.8)
        assert svc.tree.stale_beat(held) is not None
    finally:
        monkeypatch.undo()
        svc.close()


def test_an_error_redis_answers_stops_neither_the_beat_nor_the_cancel_poll(monkeypatch):
    """A ResponseError (OOM under maxmemory, READONLY in a failover) is no StoreUnavailable: it ended the
    poll thread, so a live replica stopped beating (its runs read lost) and stopped reading cancels."""
    import redis
    import torch

    from gambit.serving import target_heartbeat
    from gambit.serving.embedded import EmbeddedConfig, build_target

    torch.set_num_threads(1)
    monkeypatch.setattr(target_heartbeat, "HEARTBEAT_S", 0.05)
    svc = build_target(EmbeddedConfig(num_blocks=120), None, replica="r-err")
    tree, failures, answered = svc.tree, {"beat": 2, "cancel_requested": 2}, []

    class Refusing:  # the first calls of each kind refused by the server, then answered
        def __getattr__(self, name):
            def call(*a, **kw):
                if failures.get(name):
                    failures[name] -= 1
                    raise redis.exceptions.ResponseError("OOM command not allowed (maxmemory)")
                answered.append(name)
                return getattr(tree, name)(*a, **kw)
            return call

    try:
        tree.lease_s = 0.5
        svc.tree = Refusing()
        svc._sinks["held"] = None  # a run held here: its cancel flag is polled
        deadline = time.monotonic() + 5
        while not {"beat", "cancel_requested"} <= set(answered) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert failures == {"beat": 0, "cancel_requested": 0}
        assert {"beat", "cancel_requested"} <= set(answered)
        time.sleep(0.7)  # longer than the lease: it went on beating
        assert tree.stale_beat({"status": "running", "replica": "r-err"}) is None
    finally:
        svc._sinks.pop("held", None)
        svc.tree = tree
        monkeypatch.undo()
        svc.close()


def test_a_write_while_held_by_a_replica_leaves_a_takeovers_record(tree):
    """``put_run_if_held``: the Coordinator ends the run of a replica it lost only while that one holds it."""
    tree.put_run("a", status="running", replica="r1")
    tree.put_run("h", status="queued", replica="r1")  # held for batch slots
    tree.put_run("b", status="running", replica="r2")  # taken over
    tree.put_run("d", status="done", replica="r1")  # ended
    tree.put_run("q", status="queued")  # not admitted
    got = {r: tree.put_run_if_held(r, "r1", status="cancelled") for r in ("a", "h", "b", "d", "q", "nope")}
    assert got == {"a": True, "h": True, "b": False, "d": False, "q": False, "nope": False}
    assert [tree.get_run(r)["status"] for r in ("a", "h", "b", "d", "q")] == [
        "cancelled", "cancelled", "running", "done", "queued"]
    assert tree.get_run("nope") is None


def test_a_conditional_queued_write_skips_a_record_a_replica_holds(tree):
    """``put_run_if`` (a Coordinator ending a run no Target admitted) writes only a record naming no
    replica: "queued" with a replica id is a run held for batch slots, which its replica ends."""
    tree.put_run("q-held", status="queued", replica="r1")
    tree.put_run("q-none", status="queued", replica="")
    assert not tree.put_run_if("q-held", "queued", status="cancelled")
    assert tree.put_run_if("q-none", "queued", status="cancelled")
    assert tree.get_run("q-held")["status"] == "queued" and tree.get_run("q-none")["status"] == "cancelled"
