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

A replica may lose a run it still runs: stuck in one step past its lease, or cut off from Redis, its run was
taken over by another replica (``run_lease``, ``takeover``). Its writes of the runs it holds (``put_held``:
progress, results) are conditional, one Lua call per batch: never written over a record that names
another replica. A refused write marks the run lost (``on_lost(run_id, holder)``: the Target stops it and
frees its KV), and its later writes, the trace tree's included, are dropped. While the Target is not sure
it still holds its runs (``suspect``: its beat was withheld or failed), each batch first reads who holds
the runs it writes, so not even one round of a lost run's tree reaches the takeover's.

``InlineRecords`` has the same interface and writes at once (the in-memory stores of the embedded
wiring, where a write costs microseconds and a thread hop would cost more).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gambit.search.store import StoreUnavailable
from gambit.serving.tree_view import held_refused

log = logging.getLogger(__name__)

OnLost = Callable[[str, str], None]  # (run id, the replica its record names now)


class _Lost:
    """The runs found held by another replica (their writes are dropped) and the callback to tell."""

    def __init__(self, on_lost: OnLost | None) -> None:
        self.on_lost = on_lost
        self.lost: dict[str, str] = {}  # run id -> the replica holding it now
        self.suspect = ""  # this replica's id while it may have lost its runs (see the module docstring)
        self._lost_lock = threading.Lock()

    def lose(self, refused: dict[str, str]) -> None:
        """Mark runs held by another replica lost (once each) and tell ``on_lost`` (from any thread; never
        under a lock: the callback may wait for the Target's)."""
        with self._lost_lock:
            fresh = {r: h for r, h in refused.items() if r not in self.lost}
            self.lost.update(fresh)
        for run_id, holder in fresh.items():
            log.warning("run %s is held by replica %s now (taken over), or its record ended: its writes "
                        "here are dropped", run_id, holder)
            if self.on_lost is not None:
                try:
                    self.on_lost(run_id, holder)
                except Exception:  # noqa: BLE001 — the writer goes on
                    log.exception("on_lost failed")


class InlineRecords(_Lost):
    """Writes now, in the caller's thread; a tree-store write that fails is kept and replayed."""

    def __init__(self, store=None, tree=None, on_lost: OnLost | None = None) -> None:
        super().__init__(on_lost)
        self.store, self.tree = store, tree
        self.backlog: list[tuple] = []

    def update(self, run_id: str, up) -> None:
        if self.store is None or run_id in self.lost:
            return
        self.backlog.append((run_id, up))
        try:
            while self.backlog:
                self.store.update(*self.backlog[0])
                self.backlog.pop(0)
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            log.warning("tree store write deferred (%d pending): %s", len(self.backlog), e)

    def put_run(self, run_id: str, **fields) -> None:
        """An unconditional write (an admission: the run is this replica's again)."""
        if self.tree is None:
            return
        self.lost.pop(run_id, None)
        try:
            self.tree.put_run(run_id, **fields)
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            log.warning("run record write skipped: %s", e)

    def put_held(self, run_id: str, **fields) -> None:
        """A write of a run this replica (``fields["replica"]``) holds: none over another's record."""
        if self.tree is None or run_id in self.lost:
            return
        try:
            self.lose(_put_held(self.tree, [(run_id, fields)]))
        except StoreUnavailable as e:
            log.warning("run record write skipped: %s", e)

    def after(self, fn: Callable[[], None]) -> None:
        fn()

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def close(self) -> None:
        pass


class RecordWriter(_Lost):
    """One writer thread for a Target's Redis writes (see the module docstring)."""

    def __init__(self, store=None, tree=None, retry_s: float = 1.0, on_lost: OnLost | None = None) -> None:
        super().__init__(on_lost)
        self.store, self.tree, self.retry_s = store, tree, retry_s
        # ("tree", run_id, up) | ("run", run_id, fields) | ("held", run_id, fields) | ("call", fn)
        self._queue: list[tuple] = []
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

    def put_held(self, run_id: str, **fields) -> None:
        """As ``InlineRecords.put_held``, batched: one Lua call for the held writes of a batch."""
        if self.tree is not None:
            self._put(("held", run_id, fields))

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
            self._drop_lost()
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
            if self.suspect:
                self._check_held()
            if self._shared and self.backlog:
                p, held = self.store.r.pipeline(transaction=True), []
                for kind, group in _groups(self.backlog):
                    if kind == "tree":
                        for _, r, up in group:
                            self.store.add(p, r, up)
                    elif kind == "held":
                        held.append((len(p), [(r, f) for _, r, f in group]))  # its result's index
                        self.tree.add_runs_held(p, held[-1][1])
                    else:
                        for _, r, f in group:
                            self.tree.add_run(p, r, f)
                got = self.store._call(p.execute)
                self.backlog.clear()
                self.batches += 1
                for i, items in held:
                    self.lose(held_refused(items, got[i]))
            while self.backlog:
                kind, group = next(_groups(self.backlog))
                refused = {}
                if kind == "tree":
                    _apply_many(self.store, "update_many", "update", [(r, up) for _, r, up in group])
                elif kind == "held":
                    refused = _put_held(self.tree, [(r, f) for _, r, f in group])
                else:
                    _apply_many(self.tree, "put_runs", None, [(r, f) for _, r, f in group])
                del self.backlog[:len(group)]
                self.batches += 1
                if refused:  # what follows of those runs is not written either
                    self.lose(refused)
                    self._drop_lost()
        except StoreUnavailable as e:  # the run records' Redis or the trace tree's
            self._down_until = time.monotonic() + self.retry_s
            log.warning("Redis write deferred (%d pending): %s", len(self.backlog), e)
            return False
        self._down_until = 0.0
        return True


    def _check_held(self) -> None:
        """While ``suspect``: the runs of the backlog's writes that another replica holds now are lost (one
        read), so none of their writes goes out. Runs this replica claims again in it are left out."""
        claimed = {it[1] for it in self.backlog if it[0] == "run"}
        ids = {it[1] for it in self.backlog if it[0] != "run"} - claimed - set(self.lost)
        if not ids or not hasattr(self.tree, "holders"):
            return
        mine = self.suspect
        self.lose({r: h for r, h in self.tree.holders(ids).items() if h and h != mine})
        self._drop_lost()

    def _drop_lost(self) -> None:
        """Drop the backlog's writes of lost runs; an admission's (``put_run``) makes its run held again."""
        if not self.lost:
            return
        keep = []
        for it in self.backlog:
            if it[0] == "run":
                self.lost.pop(it[1], None)
            elif it[1] in self.lost:
                continue
            keep.append(it)
        self.backlog[:] = keep


def _groups(items: list[tuple]):
    """Runs of consecutive items of one kind: (kind, items)."""
    i = 0
    while i < len(items):
        kind = items[i][0]
        n = next((j for j in range(i, len(items)) if items[j][0] != kind), len(items))
        yield kind, items[i:n]
        i = n


def _put_held(tree, items: list[tuple[str, dict]]) -> dict[str, str]:
    """``put_runs_held`` where the view has it (one Lua call); else plain writes (a test's fake)."""
    if hasattr(tree, "put_runs_held"):
        return tree.put_runs_held(items)
    _apply_many(tree, "put_runs", None, items)
    return {}


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
    if (a is None or b is None or not hasattr(store, "add") or not hasattr(tree, "add_run")
            or not hasattr(tree, "add_runs_held")):
        return False
    keys = {"host": None, "port": 6379, "db": 0, "path": None, "password": None, "username": None}
    ka, kb = a.connection_pool.connection_kwargs, b.connection_pool.connection_kwargs
    return (all(ka.get(k, d) == kb.get(k, d) for k, d in keys.items())
            and type(a.connection_pool) is type(b.connection_pool))
