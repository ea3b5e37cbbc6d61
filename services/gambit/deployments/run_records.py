"""How the Coordinator ends and reads run records (the tree view in Redis).

A Target writes its runs' records; the Coordinator writes a run's end only where no Target can: the
run was never admitted (cancelled while Serve queued it), or its Target was lost, or it failed after
it started. Every ended run then has a result (RunInfo.result), whose message says why. A run whose
Target replica stopped beating (``run_lease.LEASE_S``) ends as failed when read (``end_if_lost``): once
its replica and the Coordinator relaying it were both gone, nobody else would end it. Nobody may read
it either, so the Coordinators also sweep (``sweep_lost``, every ``SWEEP_S``): a run a lost replica
held ends within a lease and a sweep, read or not (it said "running" until a GetRun came, in Redis and
in a drain's listing). Plain functions of the tree view, called off the event loop (they do network
round trips).
"""

from __future__ import annotations

import datetime

from google.protobuf.json_format import ParseDict

from gambit.deployments.takeover import TargetLost
from gambit.serving.convert import progress_msg, result_msg, settings_msg
from gambit.serving.run_lease import LEASE_S, holder, stale
from gambit.serving.tree_view import CANCELLED_BY_RPC, ENDED, STREAM_CLOSED, StoreUnavailable

UNSTARTED = " (before a Target admitted it)"
SWEEP_S = 60.0  # how often a Coordinator looks for replicas whose lease lapsed (one SCAN of the keys)
SWEEP_MAX = 1000  # runs one sweep ends at most (the rest: the next sweep)


def ended_result(run_id: str, status: str, message: str, total_s: float = 0.0) -> dict:
    """The result record of a run that ended with no Target's result (never admitted, its Target lost,
    failed after it started): RunInfo.result is set for every ended run, and its message says why."""
    return {"kind": "result", "run_id": run_id, "status": status, "answer": "", "majority_answer": "",
            "weighted_answer": "", "majority_votes": {}, "weighted_votes": {}, "traces": [],
            "generated_tokens": 0, "prompt_tokens": 0, "rounds": 0, "total_s": total_s, "message": message,
            "solution": "", "solution_trace": -1}


def flagged(tree, run_id: str) -> str:
    """The run's cancel flag ("" when none, or Redis does not answer: the run waits on)."""
    try:
        return tree.cancel_requested([run_id]).get(run_id, "")
    except StoreUnavailable:
        return ""


def end_queued(tree, run_id: str, result: dict) -> bool:
    """End a run's record with ``result`` while it is still queued with no replica (no Target admitted
    it): True when ended. A Target that admitted it meanwhile keeps its own record, "queued" with its
    replica id too while it holds the run for batch slots: that replica reads the cancel flag and ends
    the run itself. Raises StoreUnavailable."""
    return tree.put_run_if(run_id, "queued", status=result["status"], message=result["message"],
                           total_s=result["total_s"], result=result)


def end_queued_quietly(tree, run_id: str, result: dict) -> bool:
    """``end_queued``; False when Redis does not answer (the run's Solve ends all the same)."""
    try:
        return end_queued(tree, run_id, result)
    except StoreUnavailable:
        return False


def cancel_queued(tree, run_id: str) -> bool:
    """CancelRun of a run still queued: no Target holds it, so it ends now (its Solve's relay sees the
    flag set before; a Target that gets it later refuses it). True when ended here."""
    return end_queued(tree, run_id, ended_result(run_id, "cancelled", CANCELLED_BY_RPC + UNSTARTED))


def flag_cancel(tree, run_id: str, unstarted: bool = False, total_s: float = 0.0, lost: str = "") -> None:
    """The Target polls these flags too: a stream cancel that is lost still stops the run. A run no
    Target admitted yet (``unstarted``: still in Serve's queue) has no Target to end its record: it
    ends here, unless a Target admitted it meanwhile (it said "queued" for the whole retention, its
    run id taken). So does a run whose replica ``lost`` (that replica's id) died and that no other one
    took over yet: ended only while the lost replica still holds it ("running", or "queued" when held
    for batch slots), never where a takeover already wrote its own "running" though its started event
    had not reached the Coordinator (that replica reads the flag and stops the run, ending it itself)."""
    if not isinstance(lost, str):
        raise TypeError(f"lost: the lost replica's id (a str), got {type(lost).__name__}")
    try:
        tree.request_cancel(run_id, STREAM_CLOSED)
        if unstarted:
            end_queued(tree, run_id, ended_result(run_id, "cancelled", STREAM_CLOSED + UNSTARTED, total_s))
        if lost:  # a held run's record stayed "queued" until its lease ended it as failed, not cancelled
            d = ended_result(run_id, "cancelled", STREAM_CLOSED, total_s)
            tree.put_run_if_held(run_id, lost, status="cancelled", message=d["message"], total_s=total_s,
                                 result=d)
    except StoreUnavailable:
        pass


def held_by(tree, run_id: str) -> str:
    """The replica its record says holds the run ("" when none, or Redis does not answer)."""
    try:
        return holder(tree.get_run(run_id) or {})
    except StoreUnavailable:
        return ""


def end_failed(tree, run_id: str, message: str, total_s: float) -> bool:
    """A run that failed after it started, with no Target's result: True when written. Never over an
    ended record (final: the result a Target wrote before its stream broke, or an end for a lost replica):
    written only while the replica its record names still holds it, or while no replica does (each a
    conditional write: one that a Target's end gets ahead of is refused). Raises StoreUnavailable."""
    fields = {"status": "failed", "message": message, "total_s": total_s,
              "result": ended_result(run_id, "failed", message, total_s)}
    try:
        rec = tree.get_run(run_id)
    except ValueError:  # a record this version cannot read: written over, as before
        rec = None
    if not (rec or {}).get("status"):  # none (gone with its retention), or only the Coordinator's times
        tree.put_run(run_id, **fields)
        return True
    if rec["status"] in ENDED:
        return False
    if replica := holder(rec):
        return tree.put_run_if_held(run_id, replica, **fields)
    return tree.put_run_if(run_id, rec["status"], **fields)


def end_lost(tree, run_id: str, e: Exception, total_s: float = 0.0) -> str:
    """No replica took the run over (or the stream broke another way): the run ends in Redis as
    ``failed`` (GetRun says so; its tree stays there). Returns the message, for the client's status."""
    why = str(e) if isinstance(e, TargetLost) else f"target lost mid-run ({type(e).__name__})"
    message = f"{why}; the run ended as failed (GetRun {run_id} shows it; a retry takes a new run_id)"
    try:
        end_failed(tree, run_id, message, total_s)
    except StoreUnavailable:
        pass
    return message


def lost_message(replica: str, beat: float) -> str:
    """Why a run whose replica's lease ran out ended (GetRun's result; the time in UTC)."""
    at = datetime.datetime.fromtimestamp(beat, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"lost: its Target replica {replica} stopped answering at {at} (no heartbeat for over "
            f"{LEASE_S:g} s); the run ended as failed (a retry takes a new run_id)")


def end_if_lost(tree, run_id: str, rec: dict) -> dict:
    """``rec``, or the record ended as failed when the replica holding the run stopped beating: ended
    only while that replica still holds it and has not beaten since (a takeover's record stays). Its
    result is marked ``lost``: a Coordinator still taking the run over goes on (``Coordinator._relay``).
    Redis not answering: ``rec`` as read."""
    try:
        beat = tree.stale_beat(rec)
        if beat is None:
            return rec
        replica, message = str(rec["replica"]), lost_message(str(rec["replica"]), float(beat))
        result = ended_result(run_id, "failed", message) | {"lost": True}
        fields = {"status": "failed", "message": message, "result": result}
        if tree.put_run_if_lost(run_id, replica, beat, **fields):
            return {**rec, **fields}
        return tree.get_run(run_id) or rec  # renewed (taken over, or its replica beat) meanwhile
    except StoreUnavailable:
        return rec


def lease_lapsed(tree, run_id: str, replica: str) -> bool:
    """True when ``replica`` held the run and stopped beating: its record still names it and its beat
    is older than the lease, or a read already ended the run for that (``end_if_lost``). Redis not
    answering, or a record this version cannot read: False (the stream is waited on)."""
    try:
        rec = tree.get_run(run_id) or {}
        if str(rec.get("replica") or "") != replica or not replica:
            return False
        if rec.get("status") == "failed" and (rec.get("result") or {}).get("lost"):
            return True
        return holder(rec) == replica and tree.stale_beat(rec) is not None
    except (StoreUnavailable, ValueError):
        return False


def sweep_lost(tree, swept: dict[str, str], limit: int = SWEEP_MAX) -> list[str]:
    """End as failed (``end_if_lost``) the runs held by replicas whose lease lapsed, read or not; returns
    their ids. ``swept`` (replica -> the stale beat whose runs were all ended) is the caller's memory
    between sweeps: a replica is scanned for once per lapse, not at every sweep for the retention.
    Raises StoreUnavailable."""
    beats, now = tree.beats()
    for r in [r for r in swept if r not in beats]:  # its beat expired: forgotten
        del swept[r]
    lapsed = {r: b for r, b in beats.items() if stale(b, now, tree.lease_s) and swept.get(r) != b}
    if not lapsed:
        return []
    runs = tree.running_on(set(lapsed))
    ended = []
    for run_id in runs[:limit]:
        try:
            rec = tree.get_run(run_id)
        except ValueError:  # a record this version cannot read: left as it is
            continue
        if rec and end_if_lost(tree, run_id, rec).get("status") == "failed":
            ended.append(run_id)
    if len(runs) <= limit:
        swept.update(lapsed)
    return ended


def put_fields(tree, run_id: str, fields: dict) -> None:
    """Times measured by the Coordinator (``first_event_s``, ``total_s``), not on the Target that
    records the result: kept beside it in the run record so that GetRun's result carries them too."""
    try:
        tree.put_run(run_id, **fields)
    except StoreUnavailable:
        pass


def run_info(pb2, run_id: str, rec: dict, num_traces: int):
    """GetRun's RunInfo from a run's record."""
    info = pb2.RunInfo(run_id=run_id, status=rec.get("status", ""), num_traces=num_traces,
                       replica=str(rec.get("replica") or ""))
    if rec.get("request"):
        ParseDict(rec["request"], info.request)
    if rec.get("settings"):
        info.settings.CopyFrom(settings_msg(pb2, rec["settings"]))
    if rec.get("progress"):
        info.last_progress.CopyFrom(progress_msg(pb2, rec["progress"]))
    # a result only once ended: a run taken over after its lease ran out (``end_if_lost``) runs again
    result = rec.get("result") if info.status in ENDED else None
    if not result and info.status in ENDED:  # a record written with no result (before stop 66)
        result = ended_result(run_id, info.status, str(rec.get("message") or ""))
    if result:
        if rec.get("total_s") is not None:  # request to result, measured by the Coordinator
            result = {**result, "total_s": float(rec["total_s"])}
        info.result.CopyFrom(result_msg(pb2, result, first_event_s=float(rec.get("first_event_s") or 0.0)))
    return info
