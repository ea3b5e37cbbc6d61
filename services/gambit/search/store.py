"""Tree view store: one interface, kept in memory (optionally saved to a JSON file) or in Redis.

A run is ``meta`` (config, problem, counters), ``nodes`` (id -> node dict), ``rounds`` (the round log)
and, once finished, ``result``. Every write is one ``RunUpdate`` applied atomically, so a reader (or a
coordinator restarting) sees whole rounds only.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from gambit.search.node_json import NodeSnapshot, scalar


class StoreUnavailable(ConnectionError):
    """The store cannot be reached (the message names where it was looked for)."""


PASSWORD_ENV = "GAMBIT_REDIS_PASSWORD"  # the Redis password, for every client (never in a URL or a flag)


def has_password(url: str) -> bool:
    """``url`` carries a password (``redis://:pw@``, ``?password=``): `ps`, shell history and logs show it."""
    parts = urlsplit(url)
    return bool(parts.password) or any(q.startswith("password=") for q in parts.query.split("&"))


def redact_url(url: str) -> str:
    """``url`` without its password, the user name kept: what a message or a log line may print."""
    if not has_password(url):
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username}@{host}" if parts.username else host
    query = "&".join(q for q in parts.query.split("&") if not q.startswith("password="))
    return f"{parts.scheme}://{netloc}{parts.path}{'?' if query else ''}{query}"  # unix:///path keeps its //


def check_no_password(url: str, name: str) -> None:
    """Refuse a password inside the URL given as ``name`` (a flag or a field), naming the variable."""
    if has_password(url):
        raise ValueError(f"{name}: {redact_url(url)} with its password: a URL shows in `ps`, shell history "
                         f"and error messages; drop the password from it and export {PASSWORD_ENV}")


def login_refused(where: str, password_env: str | None, e: Exception) -> str:
    """An authentication failure said as one (it is no network fault), with what to set."""
    env, user = password_env or PASSWORD_ENV, urlsplit(where).username
    if password_env and os.environ.get(password_env):
        what = f"check {env} (set here){f' and the user name {user!r}' if user else ''}"
    else:
        what = f"set {env} (unset here)"
    return f"Redis at {where} refused the login: {what} ({e})"


@dataclass(frozen=True)
class EncodedNode:
    """A node record already encoded as JSON (``SearchRun`` builds it from cached fragments)."""

    id: int
    text: str


@dataclass
class RunUpdate:
    meta: dict = field(default_factory=dict)  # merged into the run's meta
    nodes: list[dict | EncodedNode | NodeSnapshot] = field(default_factory=list)  # upserted by node id
    rounds: list[dict] = field(default_factory=list)  # appended
    result: dict | None = None  # set: the run is finished (it expires after the store's ttl)


class TreeStore(Protocol):
    def update(self, run_id: str, up: RunUpdate) -> None: ...

    def load(self, run_id: str) -> dict | None: ...

    def unfinished(self) -> list[str]: ...

    def runs(self) -> list[str]:
        """Run ids, the one written last at the end (`gambit inspect last`)."""
        ...

    def delete(self, run_id: str) -> None: ...


def encode_nodes(nodes: list[dict | EncodedNode | NodeSnapshot]) -> dict[str, str]:
    """Node id -> JSON text, as both stores keep them (an encoded node is taken as it is, a snapshot
    encoded now)."""
    out = {}
    for n in nodes:
        if isinstance(n, (EncodedNode, NodeSnapshot)):
            out[str(n.id)] = n.text
        else:
            out[str(n["id"])] = json.dumps(n)
    return out


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or any(c in run_id for c in ":{} \n"):
        raise ValueError(f"run id must be a non-empty string without ':', braces or spaces, got {run_id!r}")
    return run_id


class MemoryStore:
    """In-process store; values go through JSON exactly as in Redis, so both behave the same. What
    the driver writes (``lazy_nodes``) is kept as it is and encoded when read: node snapshots, round
    records and results (dicts it never changes after the write, read rarely: encoding them at every
    write showed in a profile of the rounds). Node dicts and meta are encoded at the write, so a bad
    one changes nothing."""

    lazy_nodes = True

    def __init__(self, ttl_s: float = 24 * 3600) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        self.ttl_s = ttl_s
        self._expires: dict[str, float] = {}
        self._meta: dict[str, dict[str, str]] = {}
        self._nodes: dict[str, dict[str, str]] = {}
        self._rounds: dict[str, list[dict]] = {}
        self._result: dict[str, dict] = {}

    def update(self, run_id: str, up: RunUpdate) -> None:
        self._put(*self._encode(run_id, up))

    @staticmethod
    def _encode(run_id: str, up: RunUpdate) -> tuple:
        """Everything an update writes, serialised (snapshots: pinned) before anything is written."""
        check_run_id(run_id)
        meta = {k: scalar(v) for k, v in up.meta.items()}
        nodes = encode_nodes([n for n in up.nodes if not isinstance(n, NodeSnapshot)])
        nodes.update((str(n.id), n) for n in up.nodes if isinstance(n, NodeSnapshot))
        return run_id, meta, nodes, list(up.rounds), up.result  # rounds, result: encoded when read

    def _put(self, run_id: str, meta: dict, nodes: dict, rounds: list, result: dict | None) -> None:
        self._meta[run_id] = self._meta.pop(run_id, {})  # written last: at the end of the order (``runs``)
        self._meta[run_id].update(meta)
        self._nodes.setdefault(run_id, {}).update(nodes)
        self._rounds.setdefault(run_id, []).extend(rounds)
        if result is not None:
            self._result[run_id] = result
            self._expires[run_id] = time.monotonic() + self.ttl_s

    def update_many(self, items: list[tuple[str, RunUpdate]]) -> None:
        """Several updates in order (the driver writes a step's rounds at once; Redis: one MULTI). All
        or none, as Redis's: each is encoded before any is written, so a bad one writes none (the
        driver then writes them one by one, and the rounds of those before it were appended twice)."""
        for run_id, up in items:
            self._encode(run_id, up)  # cheap for the driver's writes: its nodes are snapshots
        for run_id, up in items:
            self.update(run_id, up)

    def _expire(self) -> None:
        now = time.monotonic()
        for run_id in [r for r, t in self._expires.items() if t <= now]:
            self.delete(run_id)

    def load(self, run_id: str) -> dict | None:
        self._expire()
        if run_id not in self._meta:
            return None
        result = self._result.get(run_id)
        return _assemble(self._meta[run_id], self._nodes.get(run_id, {}),
                         [json.dumps(r) for r in self._rounds.get(run_id, [])],
                         None if result is None else json.dumps(result))

    def unfinished(self) -> list[str]:
        self._expire()
        return sorted(r for r in self._meta if r not in self._result)

    def runs(self) -> list[str]:
        """Run ids, the one written last at the end (`gambit inspect last`; sorted ids put p10 before p2)."""
        self._expire()
        return list(self._meta)

    def delete(self, run_id: str) -> None:
        for d in (self._meta, self._nodes, self._rounds, self._result, self._expires):
            d.pop(run_id, None)

    # -- a file, for `gambit inspect --store FILE.json` ----------------------------------------
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({r: self.load(r) for r in self.runs()}))
        return path

    @classmethod
    def open(cls, path: str | Path) -> MemoryStore:
        path = Path(path)
        if not path.is_file():
            why = "is a directory" if path.is_dir() else "does not exist"
            raise ValueError(f"store file {path} {why}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"store file {path} is not JSON: {e}") from None
        store = cls()
        try:
            for run_id, run in data.items():
                store.update(run_id, RunUpdate(meta=run["meta"], nodes=list(run["nodes"].values()),
                                               rounds=run["rounds"], result=run["result"]))
        except (AttributeError, KeyError, TypeError):  # JSON of another shape (an eval's, a bench's)
            raise ValueError(f"store file {path} is not a tree store (`gambit run --save` writes one)") \
                from None
        return store


def _assemble(meta: dict, nodes: dict, rounds: list, result: str | None) -> dict:
    return {"meta": {k: json.loads(v) for k, v in meta.items()},
            "nodes": {int(k): json.loads(v if type(v) is str else v.text) for k, v in nodes.items()},
            "rounds": [json.loads(r) for r in rounds],
            "result": None if result is None else json.loads(result)}


def is_redis_url(spec: str | None) -> bool:
    return bool(spec) and spec.startswith(("redis://", "rediss://", "unix://"))


def open_store(spec: str | None, prefix: str = "") -> TreeStore:
    """``redis://...`` → RedisStore (keys under ``prefix``, "" = its default; the password from
    ``GAMBIT_REDIS_PASSWORD``); a path → MemoryStore read from that JSON file."""
    if is_redis_url(spec):
        from gambit.search.redis_store import RedisStore

        check_no_password(spec, "--store")  # the password comes from GAMBIT_REDIS_PASSWORD, as the services'
        return RedisStore(spec, prefix=prefix) if prefix else RedisStore(spec)
    if not spec:
        raise ValueError("store: give a JSON file written by a run or a redis:// URL")
    return MemoryStore.open(spec)
