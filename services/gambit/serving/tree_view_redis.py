"""The run records and cancel flags in Redis (the services' ``tree_view``): each conditional write is
one Lua call, so of two writers (a Solve and a takeover, two replicas) one wins.

Keys under a prefix: ``<p>run:<id>`` (a hash of JSON values, ``run_record``), ``<p>alive:<replica>``
(``run_lease``), ``<p>cancel:<id>``; the layout is ``tree_view``'s.
"""

from __future__ import annotations

import os
import time

from gambit.checks import at_least
from gambit.search.store import PASSWORD_ENV, StoreUnavailable, login_refused, redact_url  # one error: both
from gambit.serving.run_lease import BEAT, HELD, IF_HELD, IF_LOST, IF_UNHELD, LEASE_S, holder, stale
from gambit.serving.run_record import (
    CANCELLED_BY_RPC,
    ENDED,
    ENDED_ENC,
    ENDED_MARK,
    RETENTION_S,
    dec_record,
    enc,
    flat,
    held_refused,
    replica_of,
)

REDIS_URL = "redis://127.0.0.1:6379/0"

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
# unless the record names another replica (a takeover's), whose encoded id is returned for it, or ended
# (final: 'ended:' and its status returned); '' written
_PUT_HELD = f"""
local out, a = {{}}, 2
for i = 1, #KEYS, 2 do
  local me, ended, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local st = redis.call('HGET', KEYS[i], 'status')
  local r = redis.call('HGET', KEYS[i], 'replica')
  if r and r ~= me and r ~= '""' and r ~= 'null' then
    out[#out + 1] = r
  elseif {' or '.join(f"st == '{s}'" for s in ENDED_ENC)} then
    out[#out + 1] = '{ENDED_MARK}' .. st
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


class RedisTreeView:
    """``MemoryTreeView``'s records in Redis, shared by every Coordinator and Target replica."""

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
        p.hset(key, mapping={k: enc(v) for k, v in fields.items()} | {"updated": enc(time.time())})
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
            pairs = flat(fields)
            argv += [enc(fields.get("replica")), int(fields.get("status") in ENDED), len(pairs), *pairs]
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
        return {r: replica_of(f[1]) for r, f in zip(ids, got, strict=True)
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
        pairs = flat(fields)
        if self._call(self.r.eval, _CLAIM, 2, self._k("run", run_id), self._k("cancel", run_id), self.ttl,
                      *pairs):
            return None
        return self.get_run(run_id) or {}

    def put_run_if(self, run_id: str, while_status: str, /, **fields) -> bool:
        """As ``MemoryTreeView.put_run_if``, in one Lua call: a Target that admits the run meanwhile
        writes its own status and replica, and that record stays."""
        pairs = flat(fields)
        return bool(self._call(self.r.eval, IF_UNHELD, 1, self._k("run", run_id), self.ttl,
                               enc(while_status), *pairs))

    def get_run(self, run_id: str) -> dict | None:
        got = self._call(self.r.hgetall, self._k("run", run_id))
        return dec_record(run_id, got) if got else None

    def num_traces(self, run_id: str) -> int:
        """Traces of the run in the driver's tree (``gambit.search.redis_store`` layout)."""
        return int(self._call(self.r.hlen, f"{self.prefix}tree:run:{run_id}:nodes"))

    def running_on(self, replicas) -> list[str]:
        """Ids of the runs held by one of ``replicas`` (Target replica ids; as ``MemoryTreeView``'s): a scan
        of the run records (a server's stop, not a request path). The scan also meets other keys in
        their namespace: a tree store under the bare prefix (``RedisStore``'s default "gambit" writes
        ``gambit:run:<id>:meta``, a list, a string...): those are skipped, as a run id has no ':', and
        any other key that is not a record (its HMGET fails with WRONGTYPE) too."""
        want, head = {enc(x) for x in replicas}, self._k("run", "")
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
        return bool(self._call(self.r.eval, IF_HELD, 1, self._k("run", run_id), self.ttl, enc(replica),
                               *flat(fields)))

    def put_run_if_lost(self, run_id: str, replica: str, beat: str, /, **fields) -> bool:
        """As ``MemoryTreeView.put_run_if_lost``, in one Lua call."""
        return bool(self._call(self.r.eval, IF_LOST, 2, self._k("run", run_id), self._k("alive", replica),
                               self.ttl, enc(replica), beat, *flat(fields)))

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
