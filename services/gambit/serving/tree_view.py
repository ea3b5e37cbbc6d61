"""Where runs and their trace trees are recorded: Redis (services) or memory (embedded, tests).

Keys under a prefix: ``<p>run:<id>`` (hash: status, request, replica, progress, result, message),
``<p>alive:<replica>`` (a Target replica's heartbeat, ``run_lease``: the Redis server's time of its last
beat), ``<p>cancel:<id>`` (a flag holding the reason, with a TTL no longer than the records'; a new record
under the id and the run's end drop it), and the driver's trees under ``<p>tree`` (``RedisStore``:
``<p>tree:run:<id>:meta`` ...). Values are JSON, never pickle. The Redis password comes from the environment
(``GAMBIT_REDIS_PASSWORD`` by default), never from a flag or a file in the repository. A Redis
failure is ``StoreUnavailable`` with the reason, which the gRPC layer answers as UNAVAILABLE.
"""

from __future__ import annotations

import json
import os
import threading
import time

from gambit.checks import at_least
from gambit.search.store import PASSWORD_ENV, StoreUnavailable, login_refused, redact_url  # one error: both
from gambit.serving.run_lease import (
    BEAT,
    HELD,
    IF_HELD,
    IF_LOST,
    IF_UNHELD,
    LEASE_S,
    NO_REPLICA,
    holder,
    stale,
)

REDIS_URL = "redis://127.0.0.1:6379/0"
ENDED = ("done", "limit", "cancelled", "failed")
# How long a finished run's record and trace tree stay in Redis (GetRun, `gambit inspect`; its run_id stays
# taken): one setting for both (records were kept 7 days and trees 1, so GetRun said 0 traces after a day).
# Redis holds every finished run's tree, its traces' tokens included, for this long: size it by the load.
RETENTION_S = 24 * 3600
CANCELLED_BY_RPC = "cancelled by CancelRun"  # the message of a run stopped by a cancel flag
STREAM_CLOSED = "stream closed: client disconnected or coordinator lost"


def taken_message(run_id: str, record: dict) -> str:
    """Why a Solve with a client's own ``run_id`` is refused (ALREADY_EXISTS): a run holds that id."""
    status = record.get("status") or "queued"
    if status in ENDED:
        return (f"run_id: {run_id!r} belongs to a run that ended ({status}); GetRun reads it, and a new run "
                "needs a new id")
    return f"run_id: {run_id!r} is in flight ({status})"


# KEYS[1] the run's record, KEYS[2] its cancel flag; ARGV: its TTL, then field, value, ...: written only
# where no record is, and a flag left from an earlier run under the id (it outlived that record) dropped
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
return 1
"""


# KEYS: per run, its record then its cancel flag; ARGV[1] the TTL, then per run: the writing replica
# (encoded), "1" when the write ends the run, the number of field/value strings, those: each written
# unless the record names another replica (a takeover's), whose encoded id is returned for it ('' written)
_PUT_HELD = """
local out, a = {}, 2
for i = 1, #KEYS, 2 do
  local me, ended, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local r = redis.call('HGET', KEYS[i], 'replica')
  if r and r ~= me and r ~= '""' and r ~= 'null' then
    out[#out + 1] = r
  else
    redis.call('HSET', KEYS[i], unpack(ARGV, a + 3, a + 2 + n))
    redis.call('EXPIRE', KEYS[i], ARGV[1])
    if ended == '1' then redis.call('DEL', KEYS[i + 1]) end
    out[#out + 1] = ''
  end
  a = a + 3 + n
end
return out
"""


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
        self._runs.setdefault(run_id, {}).update({k: _enc(v) for k, v in fields.items()})
        self._written[run_id] = time.monotonic()
        if fields.get("status") in ENDED:  # its flag has done its work
            self._cancel.pop(run_id, None)

    def put_runs_held(self, items: list[tuple[str, dict]]) -> dict[str, str]:
        """A Target's writes of the runs it holds (each ``fields`` names its ``replica``), in order: each
        written unless the record names another replica (a takeover's: a replica that was stuck and
        recovered must not write over it). Returns the refused run ids -> the replica holding each."""
        refused = {}
        with self._lock:
            self._expire()
            for run_id, fields in items:
                other = _other(self._runs.get(run_id, {}).get("replica"), fields.get("replica"))
                if other is not None:
                    refused[run_id] = other
                else:
                    self._put(run_id, fields)
        return refused

    def holders(self, run_ids) -> dict[str, str]:
        """The replica each run's record names ("" none) for the ids that have a record."""
        with self._lock:
            return {r: _replica(self._runs[r].get("replica")) for r in run_ids if r in self._runs}

    def beats(self) -> tuple[dict[str, str], float]:
        """Every replica's last heartbeat and the clock they are read against (``run_records.sweep_lost``)."""
        with self._lock:
            return dict(self._alive), time.time()

    def claim_run(self, run_id: str, **fields) -> dict | None:
        """A new run's record, written unless one holds ``run_id``: None when written, else that record."""
        with self._lock:
            self._expire()
            if run_id in self._runs:
                return _dec_record(run_id, self._runs[run_id])
            self._runs[run_id] = {k: _enc(v) for k, v in fields.items()}
            self._written[run_id] = time.monotonic()
            self._cancel.pop(run_id, None)
            return None

    def put_run_if(self, run_id: str, while_status: str, /, **fields) -> bool:
        """Write ``fields`` only while the run's status is ``while_status`` and its record names no
        replica (True when written): a Target replica that admitted the run and holds it for batch
        slots says "queued" too, with its id, and ends the run itself (``run_lease.IF_UNHELD``)."""
        with self._lock:
            got = self._runs.get(run_id)
            if (got is None or got.get("status") != _enc(while_status)
                    or got.get("replica") not in NO_REPLICA):
                return False
            got.update({k: _enc(v) for k, v in fields.items()})
            self._written[run_id] = time.monotonic()
            return True

    def get_run(self, run_id: str) -> dict | None:
        with self._lock:
            self._expire()
            got = self._runs.get(run_id)
            return _dec_record(run_id, got) if got else None

    def num_traces(self, run_id: str) -> int:
        return 0  # the embedded wiring keeps the trace tree in the driver's MemoryStore

    def running_on(self, replicas) -> list[str]:
        """Ids of the runs held by one of ``replicas`` (Target replica ids): running there, or admitted
        there and held for batch slots ("queued" with the replica set: a drain must flag those too)."""
        with self._lock:
            return [r for r, f in self._runs.items()
                    if f.get("status") in HELD and f.get("replica") in {_enc(x) for x in replicas}]

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
            if (got is None or got.get("status") not in HELD or got.get("replica") != _enc(replica)
                    or (beat is not None and self._alive.get(replica) != beat)):
                return False
            got.update({k: _enc(v) for k, v in fields.items()})
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


class RedisTreeView:
    def __init__(self, url: str = REDIS_URL, prefix: str = "gambit:", password_env: str = PASSWORD_ENV,
                 timeout_s: float = 2.0, ttl_s: float = RETENTION_S) -> None:
        import redis

        at_least(1, ttl_s=ttl_s)
        self.prefix, self.ttl, self.lease_s = prefix, int(ttl_s), LEASE_S
        password = os.environ.get(password_env) if password_env else None
        self.url, self.password_env = redact_url(url), password_env  # the URL said in messages
        try:
            self.r = redis.Redis.from_url(url, password=password or None, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s, decode_responses=True)
        except ValueError as e:
            raise ValueError(f"bad Redis URL {self.url!r}: {e}") from None
        # InvalidResponse: something else answers there (Serve's HTTP port given as --tree)
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.AuthenticationError, redis.exceptions.InvalidResponse, OSError)
        self._not_redis = redis.exceptions.InvalidResponse
        self._refused = redis.exceptions.AuthenticationError  # a password, not the network

    def _call(self, fn, *a):
        try:
            return fn(*a)
        except self._errors as e:
            if isinstance(e, self._refused):
                why = login_refused(self.url, self.password_env, e)
                raise StoreUnavailable(f"tree store: {why}") from None
            why = " (not a Redis server?)" if isinstance(e, self._not_redis) else ""
            raise StoreUnavailable(f"tree store (Redis at {self.url}) unreachable: {e}{why}") from None

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def ping(self) -> None:
        self._call(self.r.ping)

    def put_run(self, run_id: str, **fields) -> None:
        self.put_runs([(run_id, fields)])

    def put_runs(self, items: list[tuple[str, dict]]) -> None:
        """Several run-record writes, in order, in one round trip."""
        p = self.r.pipeline()
        for run_id, fields in items:
            self.add_run(p, run_id, fields)
        self._call(p.execute)

    def add_run(self, p, run_id: str, fields: dict) -> None:
        """Queue one run-record write on a Redis pipeline ``p`` (``RecordWriter`` shares pipelines)."""
        key = self._k("run", run_id)
        p.hset(key, mapping={k: _enc(v) for k, v in fields.items()} | {"updated": _enc(time.time())})
        p.expire(key, self.ttl)
        if fields.get("status") in ENDED:  # its flag has done its work (and must not stop a later run)
            p.delete(self._k("cancel", run_id))

    def put_runs_held(self, items: list[tuple[str, dict]]) -> dict[str, str]:
        """As ``MemoryTreeView.put_runs_held``, in one Lua call (one round trip for the batch)."""
        if not items:
            return {}
        return held_refused(items, self._call(self.r.eval, _PUT_HELD, *self._held_args(items)))

    def add_runs_held(self, p, items: list[tuple[str, dict]]) -> None:
        """Queue ``put_runs_held`` on a pipeline ``p`` (its result: ``held_refused(items, result)``)."""
        p.eval(_PUT_HELD, *self._held_args(items))

    def _held_args(self, items: list[tuple[str, dict]]) -> list:
        keys, argv = [], [self.ttl]
        for run_id, fields in items:
            keys += [self._k("run", run_id), self._k("cancel", run_id)]
            flat = _flat(fields)
            argv += [_enc(fields.get("replica")), int(fields.get("status") in ENDED), len(flat), *flat]
        return [len(keys), *keys, *argv]

    def holders(self, run_ids) -> dict[str, str]:
        """As ``MemoryTreeView.holders``: one pipeline of reads."""
        ids = list(run_ids)
        if not ids:
            return {}
        p = self.r.pipeline(transaction=False)
        for r in ids:
            p.hmget(self._k("run", r), "status", "replica")
        got = self._call(lambda: p.execute(raise_on_error=False))  # a key that is no record: none
        return {r: _replica(f[1]) for r, f in zip(ids, got, strict=True)
                if not isinstance(f, Exception) and (f[0] is not None or f[1])}

    def beats(self) -> tuple[dict[str, str], float]:
        """As ``MemoryTreeView.beats``: a scan of the heartbeat keys against the Redis server's clock."""
        head = self._k("alive", "")
        keys = self._call(lambda: list(self.r.scan_iter(head + "*", count=1000)))
        p = self.r.pipeline(transaction=False)
        if keys:
            p.mget(keys)
        p.time()
        got = self._call(p.execute)
        sec, usec = got[-1]
        beats = dict(zip((k[len(head):] for k in keys), got[0], strict=True)) if keys else {}
        return {k: v for k, v in beats.items() if v is not None}, sec + usec / 1e6

    def claim_run(self, run_id: str, **fields) -> dict | None:
        """A new run's record, written unless one holds ``run_id`` (in one Lua call: of two Solves with
        one id, one writes): None when written, else that record."""
        flat = _flat(fields)
        if self._call(self.r.eval, _CLAIM, 2, self._k("run", run_id), self._k("cancel", run_id), self.ttl,
                      *flat):
            return None
        return self.get_run(run_id) or {}

    def put_run_if(self, run_id: str, while_status: str, /, **fields) -> bool:
        """As ``MemoryTreeView.put_run_if``, in one Lua call: a Target that admits the run meanwhile
        writes its own status and replica, and that record stays."""
        flat = _flat(fields)
        return bool(self._call(self.r.eval, IF_UNHELD, 1, self._k("run", run_id), self.ttl,
                               _enc(while_status), *flat))

    def get_run(self, run_id: str) -> dict | None:
        got = self._call(self.r.hgetall, self._k("run", run_id))
        return _dec_record(run_id, got) if got else None

    def num_traces(self, run_id: str) -> int:
        """Traces of the run in the driver's tree (``gambit.search.redis_store`` layout)."""
        return int(self._call(self.r.hlen, f"{self.prefix}tree:run:{run_id}:nodes"))

    def running_on(self, replicas) -> list[str]:
        """Ids of the runs held by one of ``replicas`` (Target replica ids; as ``MemoryTreeView``'s): a scan
        of the run records (a server's stop, not a request path). The scan also meets other keys in
        their namespace: a tree store under the bare prefix (``RedisStore``'s default "gambit" writes
        ``gambit:run:<id>:meta``, a list, a string...): those are skipped, as a run id has no ':', and
        any other key that is not a record (its HMGET fails with WRONGTYPE) too."""
        want, head = {_enc(x) for x in replicas}, self._k("run", "")
        keys = [k for k in self._call(lambda: list(self.r.scan_iter(head + "*", count=1000)))
                if ":" not in k[len(head):]]
        if not keys:
            return []
        p = self.r.pipeline()
        for k in keys:
            p.hmget(k, "status", "replica")
        got = self._call(lambda: p.execute(raise_on_error=False))
        return [k[len(head):] for k, fields in zip(keys, got, strict=True)
                if not isinstance(fields, Exception) and fields[0] in HELD and fields[1] in want]

    def beat(self, replica: str) -> None:
        """The replica holding runs is alive now: one write, the Redis server's time (no clock skew
        between machines), kept as long as the records it speaks for."""
        self._call(self.r.eval, BEAT, 1, self._k("alive", replica), self.ttl)

    def stale_beat(self, rec: dict) -> str | None:
        """As ``MemoryTreeView.stale_beat``: the heartbeat and the server's time in one round trip."""
        replica = holder(rec)
        if not replica:
            return None
        p = self.r.pipeline(transaction=False)
        p.get(self._k("alive", replica))
        p.time()
        beat, (sec, usec) = self._call(p.execute)
        return stale(beat, sec + usec / 1e6, self.lease_s)

    def put_run_if_held(self, run_id: str, replica: str, /, **fields) -> bool:
        """As ``MemoryTreeView.put_run_if_held``, in one Lua call."""
        return bool(self._call(self.r.eval, IF_HELD, 1, self._k("run", run_id), self.ttl, _enc(replica),
                               *_flat(fields)))

    def put_run_if_lost(self, run_id: str, replica: str, beat: str, /, **fields) -> bool:
        """As ``MemoryTreeView.put_run_if_lost``, in one Lua call."""
        return bool(self._call(self.r.eval, IF_LOST, 2, self._k("run", run_id), self._k("alive", replica),
                               self.ttl, _enc(replica), beat, *_flat(fields)))

    def request_cancel(self, run_id: str, reason: str = CANCELLED_BY_RPC) -> None:
        """A flag for the Target that holds the run; it lives no longer than the records (an hour at
        most), so it never outlives a record by much (a new record under the id drops it anyway)."""
        self._call(self.r.set, self._k("cancel", run_id), reason, min(3600, self.ttl))

    def cancel_requested(self, run_ids) -> dict[str, str]:
        """Flagged runs among ``run_ids`` -> the reason given with the flag."""
        ids = list(run_ids)
        if not ids:
            return {}
        got = self._call(self.r.mget, [self._k("cancel", r) for r in ids])
        return {r: (CANCELLED_BY_RPC if v == "1" else v) for r, v in zip(ids, got, strict=True) if v}

    def delete_run(self, run_id: str) -> None:
        self._call(self.r.delete, self._k("run", run_id), self._k("cancel", run_id))


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


def held_refused(items: list[tuple[str, dict]], got: list) -> dict[str, str]:
    """``_PUT_HELD``'s answer for ``items``: the refused run ids -> the replica holding each."""
    return {run_id: _replica(r) for (run_id, _), r in zip(items, got, strict=True) if r}


def _replica(v: str | None) -> str:
    """A record's encoded "replica" field as the id ("" when none, or not an id this version reads)."""
    try:
        got = _dec(v) if v is not None else None
    except ValueError:
        return ""
    return got if isinstance(got, str) else ""


def _other(held: str | None, mine) -> str | None:
    """The replica other than ``mine`` that a record's encoded ``held`` field names, else None."""
    if held in NO_REPLICA or held == _enc(mine):
        return None
    return _replica(held) or held


def _flat(fields: dict) -> list[str]:
    """A record's fields, and the time of the write, as the field/value list a Lua ``HSET`` takes."""
    return [x for k, v in (fields | {"updated": time.time()}).items() for x in (k, _enc(v))]


def _enc(v) -> str:
    return json.dumps(v)


def _dec(v: str):
    return json.loads(v)


def _dec_record(run_id: str, got: dict) -> dict:
    """A run record's fields decoded; one that is not JSON (written by another tool, by hand) is a
    ValueError naming the run and the field (the Coordinator answers it INTERNAL: not the caller's)."""
    out = {}
    for k, v in got.items():
        try:
            out[k] = _dec(v)
        except ValueError as e:
            raise ValueError(f"run {run_id!r}: its record's {k!r} is not JSON ({e})") from None
    return out
