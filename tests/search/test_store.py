"""One suite for both tree view stores (memory and the real Redis), plus Redis failure modes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.store import MemoryStore, RunUpdate, StoreUnavailable


@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        yield MemoryStore(ttl_s=0.4)
        return
    import uuid

    from gambit.search.redis_store import RedisStore

    s = RedisStore(prefix=f"test-{uuid.uuid4().hex[:8]}", ttl_s=0.4)
    yield s
    s.clear()


def test_update_load_roundtrip(store):
    assert store.load("r1") is None
    store.update("r1", RunUpdate(meta={"config": {"capacity": 4}, "step": 0},
                                 nodes=[{"id": 0, "parent": None, "scores": []}]))
    store.update("r1", RunUpdate(meta={"step": 8}, nodes=[{"id": 0, "parent": None, "scores": [0.5]},
                                                          {"id": 1, "parent": 0, "scores": [0.5]}],
                                 rounds=[{"round": 1, "case": 1}]))
    store.update("r2", RunUpdate(meta={"step": 1}))
    got = store.load("r1")
    assert got["meta"] == {"config": {"capacity": 4}, "step": 8}
    assert got["nodes"] == {0: {"id": 0, "parent": None, "scores": [0.5]},
                            1: {"id": 1, "parent": 0, "scores": [0.5]}}
    assert got["rounds"] == [{"round": 1, "case": 1}] and got["result"] is None
    assert store.unfinished() == ["r1", "r2"] and store.runs() == ["r1", "r2"]


def test_rounds_and_results_read_back_as_json_in_both_stores(store):
    """The memory store keeps the driver's round records and results as written and encodes them when
    read: what comes back is what Redis gives, fresh lists for tuples, nothing shared with the writer."""
    rnd, res = {"round": 1, "pruned": (3, 4), "branched": [[1, 5]]}, {"answer": "7", "votes": {"7": 2}}
    store.update("r", RunUpdate(meta={"step": 1}, rounds=[rnd], result=res))
    got = store.load("r")
    assert got["rounds"] == [{"round": 1, "pruned": [3, 4], "branched": [[1, 5]]}]
    assert got["result"] == res and got["result"] is not res and got["rounds"][0] is not rnd
    got["result"]["votes"]["7"] = 0  # a reader's copy: the store is unchanged
    assert store.load("r")["result"]["votes"] == {"7": 2}


def test_finished_runs_leave_unfinished_and_expire(store):
    store.update("a", RunUpdate(meta={"step": 1}))
    store.update("b", RunUpdate(meta={"step": 1}))
    store.update("a", RunUpdate(meta={"step": 2}, result={"answer": "42"}))
    assert store.unfinished() == ["b"]
    assert store.load("a")["result"] == {"answer": "42"}
    time.sleep(0.6)
    store.update("b", RunUpdate(meta={"step": 2}))  # in Redis an unfinished run expires too, ttl_s after
    assert store.load("a") is None and store.runs() == ["b"]  # its last write (one that is written stays)
    store.delete("b")
    assert store.runs() == [] and store.unfinished() == []


def test_the_run_written_last_is_last(store):
    """`gambit inspect last` took the id that sorts last: p9 after p10, and on a serving Redis an
    arbitrary hex id. Now the run written last."""
    for rid in ("p2", "p10", "p9"):
        store.update(rid, RunUpdate(meta={"step": 1}))
    assert store.runs()[-1] == "p9"
    store.update("p10", RunUpdate(meta={"step": 2}, result={"answer": "1"}))
    assert store.runs() == ["p2", "p9", "p10"]


def test_the_redis_index_of_runs_is_trimmed_as_runs_expire():
    """The services' Redis kept every run id ever written in one set (``runs``), trimmed only when
    someone listed them: one id per run, forever."""
    import uuid

    from gambit.search.redis_store import RedisStore

    s = RedisStore(prefix=f"test-{uuid.uuid4().hex[:8]}", ttl_s=0.3)
    try:
        for i in range(5):
            s.update(f"old{i}", RunUpdate(meta={"step": 1}, result={"answer": "1"}))
        time.sleep(0.5)
        s.update("new", RunUpdate(meta={"step": 1}, result={"answer": "2"}))  # a finish trims the index
        assert s.r.zrange(f"{s.prefix}:written", 0, -1) == ["new"] and not s.r.exists(f"{s.prefix}:runs")
    finally:
        s.clear()


def test_bad_update_changes_nothing(store):
    store.update("x", RunUpdate(meta={"step": 1}, nodes=[{"id": 0, "v": 1}]))
    with pytest.raises(TypeError):
        store.update("x", RunUpdate(meta={"step": 2}, nodes=[{"id": 0, "v": 2}, {"id": 1, "v": object()}]))
    got = store.load("x")
    assert got["meta"] == {"step": 1} and got["nodes"] == {0: {"id": 0, "v": 1}}
    with pytest.raises(ValueError, match="run id"):
        store.update("a:b", RunUpdate())


class Tee:
    """Forwards every write to two stores: one recorded sequence of rounds into both."""

    def __init__(self, a, b):
        self.a, self.b, self.writes = a, b, 0

    def update(self, run_id, up):
        self.a.update(run_id, up)
        self.b.update(run_id, up)
        self.writes += 1

    def load(self, run_id):
        return self.a.load(run_id)

    def unfinished(self):
        return self.a.unfinished()


@pytest.mark.parametrize("snapshots", [False, True])
def test_memory_and_redis_agree_on_a_recorded_run(make_engine, scorer, hard_problems, redis_store, snapshots):
    """``snapshots``: the writes carry node snapshots (what the driver gives a memory store), which
    the memory store encodes only when read, after the nodes moved on; Redis encodes them at once."""
    mem = MemoryStore()
    tee = Tee(mem, redis_store)
    tee.lazy_nodes = snapshots
    driver = SearchDriver(make_engine(num_blocks=24), scorer, tee)
    cfg = SearchConfig(capacity=6, swap=2, interval=4, warmup=12, kv_ratio=0.85)
    rid = driver.submit(hard_problems[4], cfg, run_id="rec1")
    states = []
    while driver.has_work():
        if driver.step():  # after each round (and at the end) both stores hold the same run
            states.append((mem.load(rid), redis_store.load(rid)))
    assert tee.writes > 10 and len(states) > 10
    for m, r in states:
        assert m == r
    final = mem.load(rid)
    assert final["result"]["branched"] > 0 and final["result"]["evicted"] > 0
    assert redis_store.unfinished() == [] == mem.unfinished()


def test_redis_that_does_not_answer_fails_fast_naming_the_url():
    from gambit.search.redis_store import RedisStore

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)  # accepts connections and never replies
    port = srv.getsockname()[1]
    stop = threading.Event()
    try:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"redis://127.0.0.1:{port}"):
            RedisStore(f"redis://127.0.0.1:{port}", timeout_s=0.3)
        assert time.monotonic() - t0 < 5
    finally:
        stop.set()
        srv.close()
    # nothing listening at all
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    with pytest.raises(StoreUnavailable, match=f"redis://127.0.0.1:{free}"):
        RedisStore(f"redis://127.0.0.1:{free}", timeout_s=0.3)
    with pytest.raises(ValueError, match="Redis URL"):
        RedisStore("redis://127.0.0.1:notaport", timeout_s=0.3)


def test_encoded_nodes_load_as_their_records(store):
    """A run's writes carry nodes already encoded (``EncodedNode``); both stores load them as dicts."""
    from gambit.search.node_json import NodeJSON
    from gambit.search.store import EncodedNode
    from gambit.search.tree import Node

    node = Node(0, None, 0, 0, 0.8, tokens=[4, 5, 6], scores=[0.5])
    store.update("e1", RunUpdate(meta={"step": 1}, nodes=[EncodedNode(0, NodeJSON().encode(node)),
                                                          {"id": 1, "parent": 0}]))
    assert store.load("e1")["nodes"] == {0: node.to_dict(), 1: {"id": 1, "parent": 0}}


def test_node_snapshots_load_as_their_records_at_the_write(store):
    """The driver writes node snapshots when the store keeps objects (``lazy_nodes``: memory) and
    encoded text otherwise (Redis); either way a load gives the node as it was written."""
    from gambit.search.node_json import NodeSnapshot
    from gambit.search.tree import Node

    node = Node(0, None, 0, 0, 0.8, tokens=[4, 5, 6], scores=[0.5])
    want = node.to_dict()
    store.update("s1", RunUpdate(meta={"step": 1}, nodes=[NodeSnapshot(node)]))
    node.tokens.append(7)
    node.state = "finished"
    assert store.load("s1")["nodes"] == {0: want}


def test_a_run_that_never_finishes_expires_once_its_writes_stop():
    """Only a finish set the TTLs: a run whose replica was lost (or whose serve was killed) kept its
    tree, every trace's tokens, in Redis for good, and the index of runs (``written``) had no TTL either.
    Each write now refreshes them: a run in flight stays, an abandoned one goes after the retention."""
    import uuid

    from gambit.search.redis_store import RedisStore

    s = RedisStore(prefix=f"test-{uuid.uuid4().hex[:8]}", ttl_s=1.0)
    try:
        s.update("a", RunUpdate(meta={"step": 1}, nodes=[{"id": 0, "parent": None}], rounds=[{"round": 1}]))
        for part in ("meta", "nodes", "rounds"):
            assert 0 < s.r.pttl(s._k("a", part)) <= 1000
        assert 0 < s.r.pttl(f"{s.prefix}:written") <= 1000
        time.sleep(0.6)
        s.update("a", RunUpdate(meta={"step": 2}))  # still written to: it lives on
        time.sleep(0.6)
        assert s.load("a")["meta"]["step"] == 2 and s.unfinished() == ["a"]
        time.sleep(0.8)
        assert s.load("a") is None and s.runs() == [] and s.unfinished() == []
        assert not s.r.exists(f"{s.prefix}:written")
    finally:
        s.clear()


def test_a_url_of_a_server_that_is_not_redis_is_one_line():
    """``gambit inspect RUN --store redis://127.0.0.1:8371/5`` (Serve's HTTP port) gave a traceback
    ending in ``InvalidResponse: Protocol Error: b'HTTP/1.1 400 Bad Request'``."""
    from gambit.search.redis_store import RedisStore

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
    try:
        url = f"redis://127.0.0.1:{srv.getsockname()[1]}/5"
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1:\d+/5.*not a Redis server\?"):
            RedisStore(url, timeout_s=1.0)
    finally:
        srv.close()


@pytest.mark.parametrize("url, shown", [
    ("redis://:S3cr3t-pw%21@127.0.0.1:6392/3", "redis://127.0.0.1:6392/3"),
    ("redis://user:pw@host:6379/0", "redis://user@host:6379/0"),
    ("rediss://host:6380/1?ssl_ca_certs=/ca.pem&password=pw", "rediss://host:6380/1?ssl_ca_certs=/ca.pem"),
    ("unix://:pw@/run/redis.sock?db=2", "unix:///run/redis.sock?db=2"),
    ("redis://user@host:6379/0", "redis://user@host:6379/0"),  # a user name is no secret: kept
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_a_url_said_in_a_message_holds_no_password(url, shown):
    from gambit.search.store import has_password, redact_url

    assert redact_url(url) == shown
    assert has_password(url) == (url != shown)


def test_a_store_url_with_a_password_is_refused_naming_the_flag_and_the_variable():
    """``gambit inspect --store redis://:pw@host/5`` put the password in `ps` and shell history, and
    its "not found" message printed it."""
    from gambit.search.lineage import inspect_run
    from gambit.search.store import open_store

    for spec in ("redis://:pw-XYZ@127.0.0.1:6379/5", "redis://127.0.0.1:6379/5?password=pw-XYZ"):
        with pytest.raises(ValueError, match=r"^--store: redis://127\.0\.0\.1:6379/5 .*GAMBIT_REDIS_PASSWO"):
            open_store(spec)
        with pytest.raises(ValueError) as e:
            inspect_run("nosuchrun", spec)
        assert "pw-XYZ" not in str(e.value)
