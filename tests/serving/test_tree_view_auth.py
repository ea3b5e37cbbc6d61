"""Both Redis stores against a Redis with a password (a throwaway redis-server of the test's own): the
password comes from GAMBIT_REDIS_PASSWORD, never shows in a message or a log, an ACL user name works,
and a refused login says so (it is no network fault)."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time

import pytest

from gambit.search.store import PASSWORD_ENV, StoreUnavailable

PASSWORD, USER, USER_PASSWORD = "pw-XYZ!", "gambituser", "user-pw-Q"

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture
def locked_redis():
    """A redis-server with a password and an ACL user, on a port of its own; stopped after the test."""
    import redis

    (port,) = _free_ports(1)
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--requirepass",
                             PASSWORD, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    admin = redis.Redis(port=port, password=PASSWORD, socket_timeout=2)
    for _ in range(100):
        try:
            admin.acl_setuser(USER, enabled=True, passwords=[f"+{USER_PASSWORD}"], keys=["*"],
                              commands=["+@all"])
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield proc, f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


def test_a_trace_store_whose_redis_went_down_never_prints_the_password(locked_redis, monkeypatch, caplog):
    """The Target's writer thread logged ``Redis at redis://:<password>@host/3 does not answer`` each
    second of an outage: the trace store kept the URL with the password filled in."""
    from gambit.serving.record_writer import RecordWriter
    from gambit.serving.tree_view import open_trace_store, open_tree_view

    proc, host = locked_redis
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    url = f"redis://{host}/3"
    store, tree = open_trace_store(url, "t:"), open_tree_view(url, "t:")
    writer = RecordWriter(store, tree, retry_s=0.2)
    writer.put_run("r1", status="running")
    assert writer.flush(5) and tree.get_run("r1")["status"] == "running"
    proc.terminate()
    proc.wait(timeout=10)
    with caplog.at_level(logging.WARNING, logger="gambit.serving.record_writer"):
        writer.put_run("r1", status="done")
        assert writer.flush(10)
        writer.close()
    logged = [r.getMessage() for r in caplog.records]
    assert any(f"Redis at {url} does not answer" in m for m in logged), logged
    assert not any(PASSWORD in m or "pw-XYZ" in m for m in logged), logged
    with pytest.raises(StoreUnavailable) as e:
        store.runs()
    assert str(e.value).startswith(f"Redis at {url} does not answer") and "pw-XYZ" not in str(e.value)


def test_an_acl_user_in_the_url_logs_both_stores_in(locked_redis, monkeypatch):
    """``redis://user@host/0``: the run records logged in as the user, the trace store as the user with
    no password (``invalid username-password pair`` once Ray had started)."""
    from gambit.serving.tree_view import open_trace_store, open_tree_view

    _, host = locked_redis
    monkeypatch.setenv(PASSWORD_ENV, USER_PASSWORD)
    url = f"redis://{USER}@{host}/4"
    open_tree_view(url, "a:").ping()
    store = open_trace_store(url, "a:")
    assert store.r.ping() and store.url == url
    assert store.r.acl_whoami() == USER


def test_a_refused_login_names_the_variable_not_the_network(locked_redis, monkeypatch):
    """No password said ``unreachable: HELLO must be called with the client already authenticated``, a
    wrong one ``unreachable: invalid username-password pair``: sent users to the network."""
    from gambit.serving.tree_view import open_trace_store, open_tree_view

    _, host = locked_redis
    url = f"redis://{host}/0"
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    unset = f"Redis at {url} refused the login: set {PASSWORD_ENV} (unset here)"
    with pytest.raises(StoreUnavailable) as e:
        open_tree_view(url).ping()
    assert str(e.value).startswith(f"tree store: {unset}") and "unreachable" not in str(e.value)
    with pytest.raises(StoreUnavailable) as e:
        open_trace_store(url)
    assert str(e.value).startswith(unset)
    monkeypatch.setenv(PASSWORD_ENV, "wrong-pw")
    with pytest.raises(StoreUnavailable) as e:
        open_trace_store(f"redis://{USER}@{host}/0")
    assert f"refused the login: check {PASSWORD_ENV} (set here) and the user name '{USER}'" in str(e.value)
    assert "wrong-pw" not in str(e.value)


def test_inspect_reads_the_password_from_the_environment(locked_redis, monkeypatch):
    """``gambit inspect --store redis://host`` ignored GAMBIT_REDIS_PASSWORD: the only way in was the
    password on the command line, which its "not found" message then printed."""
    from gambit.search.lineage import inspect_run
    from gambit.search.redis_store import RedisStore
    from gambit.search.store import RunUpdate

    _, host = locked_redis
    url = f"redis://{host}/5"
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    RedisStore(url, prefix="gambit:tree").update("seen", RunUpdate(meta={"step": 1}))
    with pytest.raises(ValueError, match=rf"run 'nosuchrun' is not in {url} .*\['seen'\]"):
        inspect_run("nosuchrun", url)
    with pytest.raises(ValueError) as e:
        inspect_run("nosuchrun", f"redis://:{PASSWORD}@{host}/5")
    assert str(e.value).startswith("--store: ") and PASSWORD_ENV in str(e.value)
    assert "pw-XYZ" not in str(e.value)


def test_check_startable_opens_the_trace_store_too(monkeypatch):
    """It pinged the run records only: a trace store that could not log in failed after Ray started,
    as "the Target deployment failed"."""
    from gambit.deployments.local import ServeConfig, check_startable
    from gambit.serving import tree_view

    def refused(url, prefix="gambit:", **kw):
        raise StoreUnavailable(f"Redis at {url} refused the login")

    monkeypatch.setattr(tree_view, "open_trace_store", refused)
    ports = _free_ports(3)
    cfg = ServeConfig(grpc_port=ports[0], http_port=ports[1], metrics_port=ports[2], tree="memory")
    with pytest.raises(StoreUnavailable, match="Redis at memory refused the login"):
        check_startable(cfg)


def test_serve_refuses_a_password_in_its_tree_url():
    from gambit.deployments.local import ServeConfig

    with pytest.raises(ValueError) as e:
        ServeConfig(tree="redis://:pw-XYZ@127.0.0.1:6379/0")
    assert str(e.value).startswith("tree: redis://127.0.0.1:6379/0 ") and PASSWORD_ENV in str(e.value)
    assert "pw-XYZ" not in str(e.value)
