"""The run records' view (``gambit.serving.tree_view``), in memory and in the real Redis."""

import uuid

import pytest

from gambit.serving.tree_view import MemoryTreeView, RedisTreeView, taken_message


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_claim_run_writes_a_record_only_where_none_is(kind):
    """Of two claims of one id the first writes; the second gets the record that holds it."""
    prefix = f"test-claim-{uuid.uuid4().hex[:8]}:"
    tree = MemoryTreeView() if kind == "memory" else RedisTreeView(prefix=prefix)
    try:
        assert tree.claim_run("r1", status="queued", request={"problem": "x"}) is None
        got = tree.claim_run("r1", status="queued", request={"problem": "y"})
        assert got["status"] == "queued" and got["request"] == {"problem": "x"}
        assert taken_message("r1", got) == "run_id: 'r1' is in flight (queued)"
        tree.put_run("r1", status="cancelled")
        assert "ended (cancelled)" in taken_message("r1", tree.claim_run("r1", status="queued"))
    finally:
        if kind == "redis":
            keys = list(tree.r.scan_iter(f"{tree.prefix}*"))
            if keys:
                tree.r.delete(*keys)

