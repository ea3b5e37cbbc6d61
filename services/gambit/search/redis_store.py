"""The tree view in Redis: keys namespaced by run, one MULTI/EXEC per update (or per batch of
updates), finished runs expire.

Layout under ``{prefix}``: ``run:{id}:meta`` and ``run:{id}:nodes`` (hashes of JSON values),
``run:{id}:rounds`` (list), ``run:{id}:result`` (string), ``unfinished`` (set) and ``written`` (sorted
set: run id -> time of its last write, so "last" is the run written last; trimmed as runs expire, where
the ``runs`` set it replaces grew by one id per run, forever, on a serving Redis). Every write sets the
TTL of the run's keys (and of the two indexes) to ``ttl_s`` again: a run expires ``ttl_s`` after its last
write, finished or not (a run whose replica was lost, or whose server was killed, never finishes, and
its tree, every trace's tokens, stayed in Redis for good).
Socket timeouts are set, so a Redis that does not answer raises ``StoreUnavailable`` naming the URL. The
password comes from the environment (``GAMBIT_REDIS_PASSWORD``), never from the URL kept here: every message
(a writer thread logs them each second while Redis is down) prints the URL, and it must not print that.
"""

from __future__ import annotations

import json
import os
import time
from itertools import islice

from gambit.checks import above, at_least
from gambit.search.node_json import scalar
from gambit.search.store import (
    PASSWORD_ENV,
    RunUpdate,
    StoreUnavailable,
    _assemble,
    check_run_id,
    encode_nodes,
    login_refused,
    redact_url,
)

DEFAULT_URL = "redis://127.0.0.1:6379"


class RedisStore:
    def __init__(self, url: str = DEFAULT_URL, prefix: str = "gambit", ttl_s: float = 24 * 3600,
                 timeout_s: float = 2.0, password_env: str | None = PASSWORD_ENV) -> None:
        import redis

        at_least(0.001, ttl_s=ttl_s)
        above(0, timeout_s=timeout_s)
        if not prefix or any(c in prefix for c in "{} \n"):
            raise ValueError(f"prefix must be a non-empty key prefix, got {prefix!r}")
        self.url, self.prefix, self.ttl_s = redact_url(url), prefix, ttl_s  # the URL said in messages
        self.password_env = password_env
        # InvalidResponse: something else answers there (Serve's HTTP port given as the store)
        self._errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.InvalidResponse, OSError)
        self._not_redis = redis.exceptions.InvalidResponse
        self._refused = redis.exceptions.AuthenticationError  # a password, not the network
        password = os.environ.get(password_env) if password_env else None  # a keyword: the URL's user kept
        try:
            self.r = redis.Redis.from_url(url, password=password or None, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s, decode_responses=True,
                                          retry_on_timeout=False)
        except ValueError as e:
            raise ValueError(f"bad Redis URL {self.url!r}: {e}") from None
        self._call(self.r.ping)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._errors as e:
            if isinstance(e, self._refused):
                raise StoreUnavailable(login_refused(self.url, self.password_env, e)) from None
            why = " (not a Redis server?)" if isinstance(e, self._not_redis) else ""
            raise StoreUnavailable(f"Redis at {self.url} does not answer: {e}{why}") from None

    def _k(self, run_id: str, part: str) -> str:
        return f"{self.prefix}:run:{run_id}:{part}"

    def update(self, run_id: str, up: RunUpdate) -> None:
        self.update_many([(run_id, up)])

    def update_many(self, items: list[tuple[str, RunUpdate]]) -> None:
        """Several updates, in order, as one MULTI/EXEC (one round trip; all of them or none)."""
        for run_id, _ in items:
            check_run_id(run_id)
        p = self.r.pipeline(transaction=True)  # MULTI ... EXEC: all of it or none
        for run_id, up in items:
            self.add(p, run_id, up)
        self._call(p.execute)

    def add(self, p, run_id: str, up: RunUpdate) -> None:
        """Queue one update on a Redis pipeline ``p`` (a caller may share it with other writes)."""
        check_run_id(run_id)
        meta = {k: scalar(v) for k, v in up.meta.items()}
        nodes = encode_nodes(up.nodes)
        rounds = [json.dumps(r) for r in up.rounds]
        now = time.time()
        p.zadd(f"{self.prefix}:written", {run_id: now})
        if meta:
            p.hset(self._k(run_id, "meta"), mapping=meta)
        else:
            p.hsetnx(self._k(run_id, "meta"), "_", "null")
        if nodes:
            p.hset(self._k(run_id, "nodes"), mapping=nodes)
        if rounds:
            p.rpush(self._k(run_id, "rounds"), *rounds)
        if up.result is None:
            p.sadd(f"{self.prefix}:unfinished", run_id)
        else:
            p.set(self._k(run_id, "result"), json.dumps(up.result))
            p.srem(f"{self.prefix}:unfinished", run_id)
            p.zremrangebyscore(f"{self.prefix}:written", "-inf", now - self.ttl_s)  # runs expired by now
        ttl_ms = int(self.ttl_s * 1000)  # from this write on (a part not written yet: a no-op)
        for key in [self._k(run_id, part) for part in ("meta", "nodes", "rounds", "result")] + [
                f"{self.prefix}:written", f"{self.prefix}:unfinished"]:
            p.pexpire(key, ttl_ms)

    def load(self, run_id: str) -> dict | None:
        check_run_id(run_id)
        p = self.r.pipeline(transaction=True)
        for part in ("meta", "nodes"):
            p.hgetall(self._k(run_id, part))
        p.lrange(self._k(run_id, "rounds"), 0, -1)
        p.get(self._k(run_id, "result"))
        meta, nodes, rounds, result = self._call(p.execute)
        if not meta:
            return None
        meta.pop("_", None)
        return _assemble(meta, nodes, rounds, result)

    def unfinished(self) -> list[str]:
        """Runs with no result yet whose trees are still there (an abandoned one's expired: it leaves)."""
        ids = sorted(self._call(self.r.smembers, f"{self.prefix}:unfinished"))
        p = self.r.pipeline(transaction=False)
        for r in ids:
            p.exists(self._k(r, "meta"))
        alive = [r for r, there in zip(ids, self._call(p.execute), strict=True) if there]
        if len(alive) < len(ids):
            self._call(self.r.srem, f"{self.prefix}:unfinished", *(set(ids) - set(alive)))
        return alive

    def runs(self) -> list[str]:
        """Run ids, the one written last at the end."""
        ids = self._call(self.r.zrange, f"{self.prefix}:written", 0, -1)
        p = self.r.pipeline(transaction=False)
        for r in ids:
            p.exists(self._k(r, "meta"))
        alive = [r for r, there in zip(ids, self._call(p.execute), strict=True) if there]
        gone = set(ids) - set(alive)
        if gone:  # expired runs leave the index too
            self._call(self.r.zrem, f"{self.prefix}:written", *gone)
        return alive

    def prefixes_of(self, run_id: str, limit: int = 10_000) -> list[str]:
        """Other prefixes under which this database holds the run (a bounded SCAN: ``limit`` keys at
        most), so a reader looking under the wrong one can be told the right one."""
        check_run_id(run_id)
        suffix, found = f":run:{run_id}:meta", set()
        for i, key in enumerate(self.r.scan_iter(match=f"*{suffix}", count=1000)):
            if i >= limit:
                break
            found.add((key.decode() if isinstance(key, bytes) else key).removesuffix(suffix))
        return sorted(found - {self.prefix})

    def prefixes(self, limit: int = 10_000) -> list[str]:
        """The prefixes under which this database holds runs (a bounded SCAN of their ``written``
        indexes: ``limit`` keys at most), for a reader who found none under the one it tried."""
        keys = self._call(lambda: list(islice(self.r.scan_iter(match="*:written", count=1000, _type="zset"),
                                              limit)))
        return sorted({k.removesuffix(":written") for k in keys})

    def delete(self, run_id: str) -> None:
        check_run_id(run_id)
        p = self.r.pipeline(transaction=True)
        p.delete(*(self._k(run_id, part) for part in ("meta", "nodes", "rounds", "result")))
        p.srem(f"{self.prefix}:unfinished", run_id)
        p.zrem(f"{self.prefix}:written", run_id)
        self._call(p.execute)

    def clear(self) -> None:
        """Delete every run under this prefix (tests use a random prefix)."""
        for run_id in self._call(self.r.zrange, f"{self.prefix}:written", 0, -1):
            self.delete(run_id)
        self._call(self.r.delete, *(f"{self.prefix}:{k}" for k in ("written", "runs", "unfinished")))
