"""A run record as the tree views store it: its end states, how long it stays, and its fields as JSON
strings (never pickle). Shared by ``MemoryTreeView`` and ``RedisTreeView`` (their records must read alike).
"""

from __future__ import annotations

import json
import time

from gambit.serving.run_lease import NO_REPLICA

ENDED = ("done", "limit", "cancelled", "failed")
# How long a finished run's record and trace tree stay in Redis (GetRun, `gambit inspect`; its run_id stays
# taken): one setting for both (records were kept 7 days and trees 1, so GetRun said 0 traces after a day).
# Redis holds every finished run's tree, its traces' tokens included, for this long: size it by the load.
RETENTION_S = 24 * 3600
CANCELLED_BY_RPC = "cancelled by CancelRun"  # the message of a run stopped by a cancel flag
# A held write refused because the record already ended (its end is final: a replica that recovers after
# its run was ended as lost, or cancelled for it, never writes over it) names "ended:<status>", no holder
ENDED_MARK = "ended:"
ENDED_ENC = tuple(json.dumps(s) for s in ENDED)  # the end states as encoded in the records


def held_refused(items: list[tuple[str, dict]], got: list) -> dict[str, str]:
    """``_PUT_HELD``'s answer for ``items`` (``tree_view_redis``): the refused run ids -> the replica
    holding each, or ``ended_mark`` of the record's end state."""
    return {run_id: _refusal(r) for (run_id, _), r in zip(items, got, strict=True) if r}


def ended_mark(status_enc: str) -> str:
    """What a held write refused by an ended record (its encoded ``status``) names in place of a holder."""
    return ENDED_MARK + (replica_of(status_enc) or "ended")


def _refusal(r: str) -> str:
    return ended_mark(r[len(ENDED_MARK):]) if r.startswith(ENDED_MARK) else replica_of(r)


def lost_why(holder: str, replica: str) -> str:
    """Why this ``replica`` stopped a run whose held write was refused (``holder``: ``held_refused``'s)."""
    if holder.startswith(ENDED_MARK):
        return (f"its record ended meanwhile ({holder[len(ENDED_MARK):]}): this replica {replica} lost its "
                "lease, and a final record is never written over")
    return f"taken over by Target replica {holder} (this replica {replica} lost its lease)"


def replica_of(v: str | None) -> str:
    """A record's encoded "replica" field as the id ("" when none, or not an id this version reads)."""
    try:
        got = dec(v) if v is not None else None
    except ValueError:
        return ""
    return got if isinstance(got, str) else ""


def other_replica(held: str | None, mine) -> str | None:
    """The replica other than ``mine`` that a record's encoded ``held`` field names, else None."""
    if held in NO_REPLICA or held == enc(mine):
        return None
    return replica_of(held) or held


def flat(fields: dict) -> list[str]:
    """A record's fields, and the time of the write, as the field/value list a Lua ``HSET`` takes."""
    return [x for k, v in (fields | {"updated": time.time()}).items() for x in (k, enc(v))]


def enc(v) -> str:
    return json.dumps(v)


def dec(v: str):
    return json.loads(v)


def dec_record(run_id: str, got: dict) -> dict:
    """A run record's fields decoded; one that is not JSON (written by another tool, by hand) is a
    ValueError naming the run and the field (the Coordinator answers it INTERNAL: not the caller's)."""
    out = {}
    for k, v in got.items():
        try:
            out[k] = dec(v)
        except ValueError as e:
            raise ValueError(f"run {run_id!r}: its record's {k!r} is not JSON ({e})") from None
    return out
