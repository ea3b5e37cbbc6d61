"""Where ``gambit bench serve``'s distributed wiring keeps its run records and trees: a Redis under a
key prefix of the bench's own, emptied when the bench ends.

The bench once wrote every run to the shared db 0 under one fixed prefix, kept for a day: two benches
at once shared their keys, and a shared Redis held a day of stray ones. Now each run takes a fresh
prefix, or the one ``--prefix`` names if nothing is stored under it yet (the end deletes every key
under the prefix, so a prefix in use by a service is refused, not emptied).
"""

from __future__ import annotations

import os
import re
import secrets
import time

# ``url`` without a password it may hold (``?password=`` too; the user name kept), as every other message
# says a Redis URL: for logs and the result JSON
from gambit.search.store import redact_url as shown

DEFAULT_STORE = "redis://127.0.0.1:6379/0"


def fresh_prefix(bench: str = "serve", sep: str = ":") -> str:
    """A prefix no other run uses: the bench's name, the time, this process and a random tag (``sep``
    after it: "" where the store adds its own, as ``RedisStore`` does)."""
    return f"bench-{bench}:{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}{sep}"


def check_store_url(url: str) -> None:
    """``url`` names a Redis (the distributed wiring's Coordinator and Targets need one they share)."""
    if not url.startswith(("redis://", "rediss://")):
        raise ValueError(f"--store must be a redis:// or rediss:// URL (the Coordinator and the Targets "
                         f"share it), got {url!r}")


def _client(url: str):
    import redis

    from gambit.serving.tree_view import PASSWORD_ENV

    password = os.environ.get(PASSWORD_ENV)  # as the services read it
    return redis.Redis.from_url(url, password=password or None, socket_timeout=5, socket_connect_timeout=5,
                                decode_responses=True)


def _pattern(prefix: str) -> str:
    """A SCAN pattern matching exactly the keys that start with ``prefix`` (its glob characters escaped)."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", prefix) + "*"


def store_errors() -> tuple[type[Exception], ...]:
    """What a Redis that does not answer raises."""
    import redis

    return redis.exceptions.RedisError, OSError


def check_store(url: str, prefix: str, explicit: bool) -> None:
    """Before anything loads: the store answers, and an ``explicit`` prefix holds no keys yet."""
    try:
        taken = next(iter(_client(url).scan_iter(match=_pattern(prefix), count=1000)), None)
    except store_errors() as e:
        raise OSError(f"--store {shown(url)}: no Redis answers there ({e}); start one, or give another "
                      "--store") from None
    if explicit and taken is not None:
        raise ValueError(f"--prefix {prefix}: {shown(url)} already holds keys under it (e.g. {taken}); the "
                         "bench deletes its keys at the end, so give a prefix of its own "
                         "(\"\" = a fresh one)")


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` (the bench's run records and trees); how many there were."""
    r, n, batch = _client(url), 0, []
    for key in r.scan_iter(match=_pattern(prefix), count=1000):
        batch.append(key)
        if len(batch) >= 500:
            n += r.delete(*batch)
            batch = []
    return n + (r.delete(*batch) if batch else 0)
