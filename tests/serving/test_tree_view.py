"""The run records' view (``gambit.serving.tree_view``), in memory and in the real Redis."""

import uuid

import pytest

from gambit.serving.tree_view import MemoryTreeView, RedisTreeView, taken_message


@pytest.fixture(params=["memory", "redis"])
def tree(request):
    """Each test on both views; the Redis one under a prefix of its own, deleted after."""
    if request.param == "memory":
        yield MemoryTreeView()
        return
    view = RedisTreeView(prefix=f"test-tree-{uuid.uuid4().hex[:8]}:")
    yield view
    keys = list(view.r.scan_iter(f"{view.prefix}*"))
    if keys:
        view.r.delete(*keys)


def test_claim_run_writes_a_record_only_where_none_is(tree):
    """Of two claims of one id the first writes; the second gets the record that holds it."""
    assert tree.claim_run("r1", status="queued", request={"problem": "x"}) is None
    got = tree.claim_run("r1", status="queued", request={"problem": "y"})
    assert got["status"] == "queued" and got["request"] == {"problem": "x"}
    assert taken_message("r1", got) == "run_id: 'r1' is in flight (queued)"
    tree.put_run("r1", status="cancelled")
    assert "ended (cancelled)" in taken_message("r1", tree.claim_run("r1", status="queued"))


def test_a_queued_run_given_up_on_ends_cancelled_unless_a_target_admitted_it(tree):
    """A Solve whose client left while Serve still queued it kept "queued" for the whole retention (no
    Target ever held it to write its end); CancelRun could not end it and its id stayed taken. The
    Coordinator ends it now, only while it is still queued: a Target's own status stays."""
    from gambit.deployments.coordinator import Coordinator

    coordinator = type("C", (), {"tree": tree})()
    flag_cancel = Coordinator.func_or_class._flag_cancel
    tree.claim_run("q", status="queued")
    flag_cancel(coordinator, "q", True)
    rec = tree.get_run("q")
    assert rec["status"] == "cancelled" and "before a Target admitted it" in rec["message"]
    assert tree.cancel_requested(["q"]) == {"q": rec["message"].split(" (")[0]}
    tree.claim_run("a", status="queued")
    tree.put_run("a", status="running", replica="r0")  # admitted before the flag was written
    flag_cancel(coordinator, "a", True)
    assert tree.get_run("a")["status"] == "running"  # its Target ends it (the flag stops it)
    assert not tree.put_run_if("nope", "queued", status="cancelled") and tree.get_run("nope") is None


def test_running_on_lists_the_runs_a_servers_replicas_hold(tree):
    tree.put_run("a", status="running", replica="r1")
    tree.put_run("b", status="running", replica="r2")
    tree.put_run("c", status="done", replica="r1")
    tree.put_run("d", status="queued")
    assert sorted(tree.running_on({"r1", "r2"})) == ["a", "b"]
    assert tree.running_on({"r1"}) == ["a"] and tree.running_on(set()) == []
