"""Helpers shared by the serving tests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

from gambit.serving.tree_view import MemoryTreeView, RedisTreeView


def tree_views(kind: str, prefix: str) -> Iterator:
    """A run-records view for a fixture: in memory, or in the real Redis under a prefix of its own
    whose keys are deleted after."""
    if kind == "memory":
        yield MemoryTreeView()
        return
    view = RedisTreeView(prefix=f"{prefix}-{uuid.uuid4().hex[:8]}:")
    yield view
    keys = list(view.r.scan_iter(f"{view.prefix}*"))
    if keys:
        view.r.delete(*keys)


def second_of_two_runs(svc, cfg, first: tuple[str, str], second: tuple[str, str]) -> BaseException | None:
    """Submit two runs ``(run_id, problem)`` that reach one admission (the engine thread is held
    meanwhile, so the first holds the KV when the second is checked); the first must run, and the
    second's exception (None if it ran) is returned."""
    release = threading.Event()
    held = svc.call(release.wait)
    a = svc.submit_run(*first, cfg, lambda d: None)
    b = svc.submit_run(*second, cfg, lambda d: None)
    release.set()
    held.result(timeout=10)
    assert a.result(timeout=10) is None
    return b.exception(timeout=10)


def until(cond, timeout_s: float = 5.0) -> bool:
    """Polls ``cond`` until it holds or ``timeout_s`` passes: a loaded machine delays threads, so a fixed
    sleep before an assertion was timing-flaky."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
