"""Where runs and their trace trees are recorded: Redis (services) or memory (embedded, tests).

Keys under a prefix: ``<p>run:<id>`` (hash: status, request, replica, progress, result, message),
``<p>alive:<replica>`` (a Target replica's heartbeat, ``run_lease``: the Redis server's time of its last
beat), ``<p>cancel:<id>`` (a flag holding the reason, with a TTL no longer than the records'; a new record
under the id and the run's end drop it), and the driver's trees under ``<p>tree`` (``RedisStore``:
``<p>tree:run:<id>:meta`` ...). Values are JSON, never pickle. The Redis password comes from the environment
(``GAMBIT_REDIS_PASSWORD`` by default), never from a flag or a file in the repository. A Redis
failure is ``StoreUnavailable`` with the reason, which the gRPC layer answers as UNAVAILABLE.
``MemoryTreeView`` is here, ``RedisTreeView`` (and its Lua) in ``tree_view_redis``, the record's
encoding in ``run_record``; every name is importable from here.
"""

from __future__ import annotations

import threading
import time

from gambit.checks import at_least
from gambit.search.store import (  # noqa: F401 (re-exported: one error for both stores; the bench's env)
    PASSWORD_ENV,
    StoreUnavailable,
)
from gambit.serving.run_lease import HELD, LEASE_S, NO_REPLICA, holder, stale
from gambit.serving.run_record import (  # noqa: F401 (re-exported: the services and tests read them here)
    CANCELLED_BY_RPC,
    ENDED,
    ENDED_ENC,
    RETENTION_S,
    dec_record,
    enc,
    ended_mark,
    held_refused,
    other_replica,
    replica_of,
)
from gambit.serving.tree_view_redis import REDIS_URL, RedisTreeView  # noqa: F401 (re-exported)

STREAM_CLOSED = "stream closed: client disconnected or coordinator lost"


def taken_message(run_id: str, record: dict) -> str:
    """Why a Solve with a client's own ``run_id`` is refused (ALREADY_EXISTS): a run holds that id."""
    status = record.get("status") or "queued"
    if status in ENDED:
        return (f"run_id: {run_id!r} belongs to a run that ended ({status}); GetRun reads it, and a new run "
                "needs a new id")
    return f"run_id: {run_id!r} is in flight ({status})"


class MemoryTreeView:
    """The records of the embedded wiring (one process). As in Redis, a record goes ``ttl_s`` after its
    last write and its flag with it: they grew for the life of a long benchmark's process."""

    def __init__(self, ttl_s: float = RETENTION_S) -> None:
        at_least(1, ttl_s=ttl_s)
        self.ttl = ttl_s
        self._runs: dict[str, dict] = {}
        self._cancel: dict[str, str] = {}
        self._written: dict[str, float] = {}  # run id -> monotonic time of its record's last write
        self._alive: dict[str, str] = {}  # replica -> time of its last heartbeat (``beat``)
        self.lease_s = LEASE_S
        self._sweep_at = 0.0
        self._lock = threading.Lock()

    def _expire(self) -> None:
        """Drop the records not written for ``ttl`` (a sweep at most every 1/10 of it; the lock held)."""
        now = time.monotonic()
        if now < self._sweep_at:
            return
        self._sweep_at = now + self.ttl / 10
        for r in [r for r, t in self._written.items() if now - t > self.ttl]:
            for d in (self._runs, self._cancel, self._written):
                d.pop(r, None)

    def ping(self) -> None:
        pass

    def put_run(self, run_id: str, **fields) -> None:
        with self._lock:
            self._expire()
            self._put(run_id, fields)

    def _put(self, run_id: str, fields: dict) -> None:
        self._runs.setdefault(run_id, {}).update({k: enc(v) for k, v in fields.items()})
        self._written[run_id] = time.monotonic()
        if fields.get("status") in ENDED:  # its flag has done its work
            self._cancel.pop(run_id, None)

    def put_runs_held(self, items: list[tuple[str, dict]]) -> dict[str, str]:
        """A Target's writes of the runs it holds (each ``fields`` names its ``replica``), in order: each
        written unless the record names another replica (a takeover's: a replica that was stuck and
        recovered must not write over it) or ended (final: ended as lost, or cancelled, while this replica
        was thought gone). Returns the refused run ids -> the replica holding each (or ``ended_mark``)."""
        refused = {}
        with self._lock:
            self._expire()
            for run_id, fields in items:
                got = self._runs.get(run_id, {})
                other = other_replica(got.get("replica"), fields.get("replica"))
                if other is not None:
                    refused[run_id] = other
                elif got.get("status") in ENDED_ENC:  # final: a recovered replica never writes over it
                    refused[run_id] = ended_mark(got["status"])
                else:
                    self._put(run_id, fields)
        return refused

    def holders(self, run_ids) -> dict[str, str]:
        """The replica each run's record names ("" none) for the ids that have a record."""
        with self._lock:
            return {r: replica_of(self._runs[r].get("replica")) for r in run_ids if r in self._runs}

    def beats(self) -> tuple[dict[str, str], float]:
        """Every replica's last heartbeat and the clock they are read against (``run_records.sweep_lost``)."""
        with self._lock:
            return dict(self._alive), time.time()

    def claim_run(self, run_id: str, **fields) -> dict | None:
        """A new run's record, written unless one holds ``run_id``: None when written, else that record."""
        with self._lock:
            self._expire()
            if run_id in self._runs:
                return dec_record(run_id, self._runs[run_id])
            self._runs[run_id] = {k: enc(v) for k, v in fields.items()}
            self._written[run_id] = time.monotonic()
            self._cancel.pop(run_id, None)
            return None

    def put_run_if(self, run_id: str, while_status: str, /, **fields) -> bool:
        """Write ``fields`` only while the run's status is ``while_status`` and its record names no
        replica (True when written): a Target replica that admitted the run and holds it for batch
        slots says "queued" too, with its id, and ends the run itself (``run_lease.IF_UNHELD``)."""
        with self._lock:
            got = self._runs.get(run_id)
            if (got is None or got.get("status") != enc(while_status)
                    or got.get("replica") not in NO_REPLICA):
                return False
            got.update({k: enc(v) for k, v in fields.items()})
            self._written[run_id] = time.monotonic()
            return True

    def get_run(self, run_id: str) -> dict | None:
        with self._lock:
            self._expire()
            got = self._runs.get(run_id)
            return dec_record(run_id, got) if got else None

    def num_traces(self, run_id: str) -> int:
        return 0  # the embedded wiring keeps the trace tree in the driver's MemoryStore

    def running_on(self, replicas) -> list[str]:
        """Ids of the runs held by one of ``replicas`` (Target replica ids): running there, or admitted
        there and held for batch slots ("queued" with the replica set: a drain must flag those too)."""
        with self._lock:
            return [r for r, f in self._runs.items()
                    if f.get("status") in HELD and f.get("replica") in {enc(x) for x in replicas}]

    def beat(self, replica: str) -> None:
        """The replica holding runs is alive now (``TargetService`` calls it every ``HEARTBEAT_S``)."""
        with self._lock:
            self._alive[replica] = repr(time.time())

    def stale_beat(self, rec: dict) -> str | None:
        """The last heartbeat of the replica holding the run of ``rec``, when older than ``lease_s``
        (the run is lost); None while it is held by a live replica, not held, or its replica never beat."""
        replica = holder(rec)
        with self._lock:
            beat = self._alive.get(replica) if replica else None
        return stale(beat, time.time(), self.lease_s)

    def put_run_if_held(self, run_id: str, replica: str, /, **fields) -> bool:
        """Write ``fields`` only while ``replica`` holds the run (True when written): a Coordinator that
        lost that replica ends its run, and a takeover's record (another replica's) stays."""
        return self._put_if_held(run_id, replica, None, fields)

    def put_run_if_lost(self, run_id: str, replica: str, beat: str, /, **fields) -> bool:
        """Write ``fields`` only while ``replica`` holds the run and ``beat`` is still its last heartbeat
        (True when written): a takeover's record, or a replica that beat again, stays."""
        return self._put_if_held(run_id, replica, beat, fields)

    def _put_if_held(self, run_id: str, replica: str, beat: str | None, fields: dict) -> bool:
        """``put_run_if_held``; with ``beat``, only while that is still the replica's last heartbeat."""
        with self._lock:
            got = self._runs.get(run_id)
            if (got is None or got.get("status") not in HELD or got.get("replica") != enc(replica)
                    or (beat is not None and self._alive.get(replica) != beat)):
                return False
            got.update({k: enc(v) for k, v in fields.items()})
            self._written[run_id] = time.monotonic()
            return True

    def request_cancel(self, run_id: str, reason: str = CANCELLED_BY_RPC) -> None:
        with self._lock:
            self._cancel[run_id] = reason
            self._written.setdefault(run_id, time.monotonic())  # a flag with no record goes in time too

    def cancel_requested(self, run_ids) -> dict[str, str]:
        """Flagged runs among ``run_ids`` -> the reason given with the flag."""
        with self._lock:
            return {r: self._cancel[r] for r in run_ids if r in self._cancel}

    def delete_run(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            self._cancel.pop(run_id, None)
            self._written.pop(run_id, None)


def open_trace_store(url: str, prefix: str = "gambit:", password_env: str = PASSWORD_ENV,
                     retention_s: float = RETENTION_S):
    """The search driver's TreeStore (trace tree) next to the run records: memory or Redis."""
    from gambit.search.store import MemoryStore

    if url == "memory":
        return MemoryStore()
    from gambit.search.redis_store import RedisStore

    # the password as a keyword, never in the URL the store keeps and its messages print (an ACL user
    # name in the URL stays: ``redis://user@host/0`` logs in as that user)
    return RedisStore(url, prefix=f"{prefix}tree", ttl_s=retention_s, password_env=password_env)


def open_tree_view(url: str, prefix: str = "gambit:", password_env: str = PASSWORD_ENV,
                   retention_s: float = RETENTION_S):
    """``"memory"`` or a ``redis://`` URL."""
    if url == "memory":
        return MemoryTreeView(retention_s)
    return RedisTreeView(url, prefix, password_env, ttl_s=retention_s)
