"""The Coordinator's reads and writes of run records (no Ray: its methods on a stand-in ``self``)."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from gambit.deployments.coordinator import Coordinator, RPCError
from gambit.serving.tree_view import RedisTreeView


@pytest.fixture
def view():
    v = RedisTreeView(prefix=f"test-coord-{uuid.uuid4().hex[:8]}:")
    yield v
    keys = list(v.r.scan_iter(f"{v.prefix}*"))
    if keys:
        v.r.delete(*keys)


def _known_run(view, run_id: str):
    me = type("C", (), {"tree": view, "_check": lambda self, ctx: None})()
    req = type("R", (), {"run_id": run_id})()
    return asyncio.run(Coordinator.func_or_class._known_run(me, req, None))


def test_a_record_redis_holds_that_is_not_json_is_internal_naming_the_run(view):
    """GetRun of such a record answered INVALID_ARGUMENT "Expecting value: line 1 column 1 (char 0)":
    not the caller's argument, and neither the run nor the field named."""
    view.put_run("ok", status="done")
    assert _known_run(view, "ok")[1]["status"] == "done"
    view.r.hset(view._k("run", "ok"), "progress", "not json")
    with pytest.raises(RPCError) as e:
        _known_run(view, "ok")
    assert e.value.code == grpc.StatusCode.INTERNAL
    assert "run 'ok'" in e.value.message and "'progress'" in e.value.message
    with pytest.raises(ValueError, match="run_id"):  # a bad id is still the caller's
        _known_run(view, "bad:id")
