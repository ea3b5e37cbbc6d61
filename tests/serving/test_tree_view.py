"""The run records' view (``gambit.serving.tree_view``), in memory and in the real Redis."""

import socket
import threading

import pytest
from serving_util import tree_views

from gambit.serving.tree_view import MemoryTreeView, RedisTreeView, taken_message


@pytest.fixture(params=["memory", "redis"])
def tree(request):
    """Each test on both views; the Redis one under a prefix of its own, deleted after."""
    yield from tree_views(request.param, "test-tree")


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


def test_running_on_includes_runs_held_for_batch_slots_on_those_replicas(tree):
    """A run the Target admitted and holds for batch slots says "queued" with its replica: a drain of
    that replica must flag it too (it was cut off with no Result); one no Target admitted has no replica."""
    tree.put_run("held", status="queued", replica="r1")
    tree.put_run("waiting", status="queued")
    tree.put_run("other", status="queued", replica="r2")
    assert tree.running_on({"r1"}) == ["held"]


def test_running_on_skips_the_tree_stores_keys_that_share_its_prefix(tree):
    """`bench rounds --store redis://` (RedisStore, prefix "gambit") writes ``gambit:run:<id>:meta``...
    in the namespace of the services' records (``gambit:`` + ``run:<id>``): the stop's scan matched
    them and its HMGET failed with WRONGTYPE, so no run was drained."""
    from gambit.deployments.drain import drain
    from gambit.search.redis_store import RedisStore
    from gambit.search.store import RunUpdate

    if isinstance(tree, RedisTreeView):
        for prefix in (tree.prefix.rstrip(":"), tree.prefix + "run"):  # the second: <p>run:written, a zset
            RedisStore(prefix=prefix).update("benchrun", RunUpdate(meta={"step": 1}, rounds=[{"round": 1}]))
    tree.put_run("svc1", status="running", replica="rep1")
    assert tree.running_on({"rep1"}) == ["svc1"]
    tree.put_run("svc1", status="done", replica="rep1")
    assert drain(tree, {"rep1"}, wait_s=0.1) == []


def _record_expires(tree, run_id: str) -> None:
    """What the retention does to a run's record (its cancel flag may outlive it)."""
    if isinstance(tree, RedisTreeView):
        tree.r.delete(tree._k("run", run_id))
    else:
        tree._runs.pop(run_id)


def test_a_cancel_flag_never_stops_a_later_run_under_its_id(tree):
    """A flag lived 1 h whatever the retention: after a cancelled run's record expired, a new run under
    its id was cancelled at once ("cancelled by CancelRun", 0 rounds). A new record clears the flag, a
    run's end drops it, and in Redis it lives no longer than the records."""
    assert tree.claim_run("r", status="queued") is None
    tree.request_cancel("r")
    _record_expires(tree, "r")
    assert tree.claim_run("r", status="queued") is None and tree.cancel_requested(["r"]) == {}
    tree.request_cancel("r")
    tree.put_run("r", status="cancelled", result={"status": "cancelled"})
    assert tree.cancel_requested(["r"]) == {}
    if isinstance(tree, RedisTreeView):
        short = RedisTreeView(prefix=tree.prefix, ttl_s=60)
        short.request_cancel("s")
        assert 0 < short.r.ttl(short._k("cancel", "s")) <= 60


def test_a_record_that_is_not_json_is_named_with_its_field(tree):
    """GetRun of a record holding a non-JSON value said INVALID_ARGUMENT "Expecting value: line 1
    column 1 (char 0)": neither the run nor the field (``Coordinator._known_run`` answers INTERNAL)."""
    if not isinstance(tree, RedisTreeView):
        pytest.skip("the memory view encodes every value itself")
    tree.put_run("bad", status="done")
    tree.r.hset(tree._k("run", "bad"), "result", "{oops")
    with pytest.raises(ValueError, match=r"run 'bad': its record's 'result' is not JSON"):
        tree.get_run("bad")


def _http_server():
    """A port that answers like an HTTP server (Serve's HTTP port, given as --tree by mistake)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.recv(1024)
            c.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            c.close()

    threading.Thread(target=answer, daemon=True).start()
    return srv


def test_a_url_of_a_server_that_is_not_redis_is_one_line():
    """``gambit serve --tree redis://127.0.0.1:8371/5`` (Serve's HTTP port) gave a traceback ending in
    ``InvalidResponse: Protocol Error: b'HTTP/1.1 400 Bad Request'``."""
    from gambit.search.store import StoreUnavailable

    srv = _http_server()
    try:
        url = f"redis://127.0.0.1:{srv.getsockname()[1]}/5"
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1:\d+/5.*not a Redis server\?"):
            RedisTreeView(url, timeout_s=1.0).ping()
    finally:
        srv.close()


def test_the_memory_view_forgets_a_record_after_its_retention_as_redis_does():
    """The embedded wiring's records and flags had no retention: they grew for the life of the process."""
    import time

    view = MemoryTreeView(ttl_s=2)
    view.claim_run("old", status="queued")
    view.put_run("old", status="done")
    view.request_cancel("ghost")  # a flag with no record
    time.sleep(1.2)
    view.put_run("new", status="running")
    time.sleep(1.2)
    assert view.get_run("old") is None and view.cancel_requested(["ghost"]) == {}
    assert view.get_run("new")["status"] == "running"  # written 1.2 s ago: still there
    assert view.claim_run("old", status="queued") is None  # its id is free again
