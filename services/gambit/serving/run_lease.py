"""The liveness lease of the runs a Target replica holds: the rules both tree views share.

A replica beats one key (``<p>alive:<replica>``) every ``HEARTBEAT_S`` (``target_heartbeat.Heartbeat.run``):
one write per replica, not per run. A run its record says a replica holds ("running", or "queued" when
admitted and held for batch slots) is lost once that replica has not beaten for ``LEASE_S``: its record
said "running" for the whole retention once its replica and the Coordinator relaying it were both gone.
It ends as failed when read (``run_records.end_if_lost``) or at the Coordinators' next sweep
(``run_records.sweep_lost``), by a conditional write (``IF_LOST``) that never overwrites a takeover's
record or a replica that beat again; a Coordinator relaying it takes it over (``takeover.LeaseLost``).
Redis keeps the beat in its own clock (``TIME``), so machines' clocks never disagree on a lease. ``BEAT``
writes after ``TIME`` (a
non-deterministic command): Redis >= 5 replicates a script's effects, not the script, and allows that (the
chart's 7.2 does); Redis 3.2-4 would refuse the write ("Write commands not allowed after non deterministic").

The beat speaks for the engine, not for the process: a thread that beat while the engine thread was stuck
in one step (a hung kernel, a deadlock) kept a wedged replica's runs held for ever. ``Progress`` is the
rule: the engine loop marks when it starts and ends work, and the beat is written only while no piece of
work has run for over ``STUCK_S`` (far above any real step, so a long prefill is no death).
"""

from __future__ import annotations

import json
import threading
import time

HEARTBEAT_S = 5.0
LEASE_S = 3 * HEARTBEAT_S  # three beats missed: a busy node's pause is not a death
STUCK_S = 120.0  # one engine step (or admission) running longer: the replica is wedged, its lease lapses
HELD_STATUSES = ("running", "queued")  # record statuses of a run a replica holds (with its "replica")
HELD = tuple(json.dumps(s) for s in HELD_STATUSES)  # the same, as encoded in the records
NO_REPLICA = (None, json.dumps(""), json.dumps(None))  # a record's "replica" (encoded) when none holds it

# KEYS[1] the replica's heartbeat; ARGV[1] its TTL. The Redis server's clock, one for every machine.
BEAT = """
local t = redis.call('TIME')
redis.call('SET', KEYS[1], t[1] .. '.' .. string.format('%06d', tonumber(t[2])), 'EX', ARGV[1])
return 1
"""

# KEYS[1] the record; ARGV[2] a replica: the run is still held by that replica (a takeover writes its own)
_HELD_BY = f"""
local st = redis.call('HGET', KEYS[1], 'status')
if {' and '.join(f"st ~= '{s}'" for s in HELD)} then return 0 end
if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[2] then return 0 end
"""


def _write_from(first: int) -> str:
    """The Lua that writes the field/value pairs from ARGV[first] on, and renews the TTL (ARGV[1])."""
    return f"""redis.call('HSET', KEYS[1], unpack(ARGV, {first}))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


# KEYS[1] the record; ARGV[2] a status: the record says it and names no replica (a run not admitted yet:
# a replica that admitted it and holds it for batch slots also says "queued", with its id)
_UNHELD_IN = f"""
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[2] then return 0 end
local r = redis.call('HGET', KEYS[1], 'replica')
if r and {' and '.join(f"r ~= '{x}'" for x in NO_REPLICA if x)} then return 0 end
"""

# KEYS[1] the record; ARGV: the TTL, the status, then fields: written only while the record says that
# status and no replica holds the run (a Coordinator ending a run no Target admitted)
IF_UNHELD = _UNHELD_IN + _write_from(3)

# KEYS[1] the record; ARGV: the TTL, the replica, then fields: written only while that replica holds the
# run (a Coordinator ending the run of a replica it lost: a takeover's record stays)
IF_HELD = _HELD_BY + _write_from(3)

# KEYS[1] the record, KEYS[2] its replica's heartbeat; ARGV: the TTL, the replica, the stale beat seen,
# then fields: written only while the run is still held by that replica (a takeover writes its own)
# and that beat is still the last one (a replica that beat again is alive)
IF_LOST = _HELD_BY + """if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
""" + _write_from(4)


def holder(rec: dict) -> str:
    """The Target replica holding the run of a decoded record ("" when none: not admitted, or ended)."""
    return str(rec.get("replica") or "") if rec.get("status") in HELD_STATUSES else ""


def stale(beat: str | None, now: float, lease_s: float) -> str | None:
    """``beat`` (a replica's last heartbeat, seconds) when older than ``lease_s`` at ``now``, else None
    (alive, or never beat: a replica not known is not known lost)."""
    return beat if beat is not None and now - float(beat) > lease_s else None


class Progress:
    """Whether the engine loop still moves: ``busy()`` before a piece of work (an admission, a step),
    ``idle()`` once it ended or the loop waits. The heartbeat asks ``moving()`` before each beat."""

    def __init__(self, stuck_s: float = STUCK_S, clock=time.monotonic) -> None:
        if not stuck_s > 0:
            raise ValueError(f"stuck_s must be > 0, got {stuck_s}")
        self.stuck_s, self.clock = stuck_s, clock
        self._since: float | None = None  # when the work under way began (None: idle)
        self._lock = threading.Lock()

    def busy(self) -> None:
        with self._lock:
            self._since = self.clock()

    def idle(self) -> None:
        with self._lock:
            self._since = None

    def stuck_for(self) -> float:
        """Seconds the work under way has run (0 while idle)."""
        with self._lock:
            since = self._since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def moving(self) -> bool:
        """False once one piece of work has run for over ``stuck_s``: stop beating, the runs go elsewhere."""
        return self.stuck_for() <= self.stuck_s
