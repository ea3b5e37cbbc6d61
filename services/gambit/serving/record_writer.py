"""Run records and tree-store writes, kept off the engine thread.

A Target writes to Redis once per round per run (the driver's tree store), for throttled progress
and for each result. Done inline, every write is a network round trip inside the engine loop: on
a busy 2-core machine that was ~10% of a run's wall time. ``RecordWriter`` applies them from one
thread instead, in the order they were made, and whatever queued up while a write was in flight
goes out as one pipeline. ``after(fn)`` runs ``fn`` once everything queued before it has been
tried, so a result reaches its client only after its records were written (a GetRun right after
the stream ends sees them), and a round's progress only after its tree write was tried (a replica
lost later is taken over at that round or past it, so the rounds a client sees do not go back). A
Redis outage never stops decoding: failed writes are kept and replayed in order once Redis answers
again (retried every ``retry_s``), and callbacks still run (a progress sent then may be redone by a
takeover).

``InlineRecords`` has the same interface and writes at once (the in-memory stores of the embedded
wiring, where a write costs microseconds and a thread hop would cost more).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gambit.search.store import StoreUnavailable

log = logging.getLogger(__name__)


class InlineRecords:
    """Writes now, in the caller's thread; a tree-store write that fails is kept and replayed."""

    def __init__(self, store=None, tree=None) -> None:
        self.store, self.tree = store, tree
        self.backlog: list[tuple] = []

    def update(self, run_id: str, up) -> None:
        if self.store is None:
            return
        self.backlog.append((run_id, up))
        try:
            while self.backlog:
                self.store.update(*self.backlog[0])
                self.backlog.pop(0)
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            log.warning("tree store write deferred (%d pending): %s", len(self.backlog), e)

    def put_run(self, run_id: str, **fields) -> None:
        if self.tree is None:
            return
        try:
            self.tree.put_run(run_id, **fields)
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            log.warning("run record write skipped: %s", e)

    def after(self, fn: Callable[[], None]) -> None:
        fn()

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def close(self) -> None:
        pass


class RecordWriter:
    """One writer thread for a Target's Redis writes (see the module docstring)."""

    def __init__(self, store=None, tree=None, retry_s: float = 1.0) -> None:
        self.store, self.tree, self.retry_s = store, tree, retry_s
        self._queue: list[tuple] = []  # ("tree", run_id, up) | ("run", run_id, fields) | ("call", fn)
        self.backlog: list[tuple] = []  # writes not applied yet because Redis did not answer
        self._cv = threading.Condition()
        self._busy = False
        self._closed = False
        self._down_until = 0.0
        self.batches = 0
        self._shared: bool | None = None  # store and run records in one Redis (known at the first write)
        self._thread = threading.Thread(target=self._loop, name="record-writer", daemon=True)
        self._thread.start()

    # -- what the engine thread calls (never blocks on the network) ------------------------------
    def update(self, run_id: str, up) -> None:
        if self.store is not None:
            self._put(("tree", run_id, up))

    def put_run(self, run_id: str, **fields) -> None:
        if self.tree is not None:
            self._put(("run", run_id, fields))

    def after(self, fn: Callable[[], None]) -> None:
        self._put(("call", fn))

    def _put(self, item: tuple) -> None:
        with self._cv:
            self._queue.append(item)
            self._cv.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far was tried; False on timeout."""
        done = threading.Event()
        self.after(done.set)
        return done.wait(timeout)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)

    # -- the writer thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    if not self.backlog:
                        self._cv.wait()
                        continue
                    left = self._down_until - time.monotonic()  # writes wait to be replayed
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if not self._queue and not self.backlog:
                    return
                batch, self._queue = self._queue, []
            self.backlog += [it for it in batch if it[0] != "call"]
            if self.backlog and time.monotonic() >= self._down_until:
                try:
                    if not self._write():  # a dropped connection: the client reconnects on a retry
                        self._write()
                except Exception:  # noqa: BLE001 — a write Redis rejects can never succeed: drop it
                    log.exception("Redis rejected %d writes; dropped", len(self.backlog))
                    self.backlog.clear()
            for it in batch:
                if it[0] == "call":
                    try:
                        it[1]()
                    except Exception:  # noqa: BLE001 — a failing callback must not stop the writer
                        log.exception("record writer callback failed")
            if self._closed and not self._queue and (not self.backlog or time.monotonic() < self._down_until):
                return

    def _write(self) -> bool:
        """Apply the backlog in order: as one MULTI/EXEC when the store and the run records live in
        the same Redis (one round trip), else consecutive writes of one kind as one pipeline. False:
        Redis did not answer; what is left waits ``retry_s``."""
        if self._shared is None:
            self._shared = _same_redis(self.store, self.tree)
        try:
            if self._shared:
                p = self.store.r.pipeline(transaction=True)
                for it in self.backlog:
                    if it[0] == "tree":
                        self.store.add(p, it[1], it[2])
                    else:
                        self.tree.add_run(p, it[1], it[2])
                self.store._call(p.execute)
                self.backlog.clear()
                self.batches += 1
            while self.backlog:
                kind = self.backlog[0][0]
                n = next((i for i, it in enumerate(self.backlog) if it[0] != kind), len(self.backlog))
                group = self.backlog[:n]
                if kind == "tree":
                    _apply_many(self.store, "update_many", "update", [(r, up) for _, r, up in group])
                else:
                    _apply_many(self.tree, "put_runs", None, [(r, f) for _, r, f in group])
                del self.backlog[:n]
                self.batches += 1
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            self._down_until = time.monotonic() + self.retry_s
            log.warning("Redis write deferred (%d pending): %s", len(self.backlog), e)
            return False
        self._down_until = 0.0
        return True


def _apply_many(target, many: str, one: str | None, items: list[tuple]) -> None:
    if hasattr(target, many):
        getattr(target, many)(items)
    elif one is not None:
        for a, b in items:
            getattr(target, one)(a, b)
    else:
        for run_id, fields in items:
            target.put_run(run_id, **fields)


def _same_redis(store, tree) -> bool:
    """Both are Redis clients of one server and database (then one pipeline can carry both)."""
    a, b = getattr(store, "r", None), getattr(tree, "r", None)
    if a is None or b is None or not hasattr(store, "add") or not hasattr(tree, "add_run"):
        return False
    keys = {"host": None, "port": 6379, "db": 0, "path": None, "password": None, "username": None}
    ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    return (all(ka.get(k, d) == kb.get(k, d) for k, d in keys.items())
            and type(a.connection_pool) is type(b.connection_pool))
