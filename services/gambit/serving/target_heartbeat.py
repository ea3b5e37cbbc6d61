"""A Target replica's second thread: its heartbeat, the cancel flags of the runs it holds, and the check
for takeovers after a beat that may have come too late.

CancelRun sets a flag in the tree view (any coordinator); this thread stops the flagged runs held here.
It also writes the replica's heartbeat every ``HEARTBEAT_S`` while its engine thread lives and moves: the
lease of the runs it holds (``run_lease.LEASE_S``; here, not on the engine thread, so a long step is no
death; one stuck for over ``run_lease.STUCK_S`` is, ``TargetService.progress``). While it is stuck, the
runs waiting for admission are refused (``TargetService._refuse_queued``): another replica takes them.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gambit.search.store import StoreUnavailable
from gambit.serving.run_lease import HEARTBEAT_S, LEASE_S

if TYPE_CHECKING:
    from gambit.serving.target_service import TargetService

log = logging.getLogger("gambit.serving.target_service")  # its messages were the service's: same logger


class Heartbeat:
    """The heartbeat and cancel-poll loop of one ``TargetService`` (its thread "cancel-poll"). It reads the
    service's state as it goes (its runs, ``records``, ``tree``, ``cancel_poll_s``), never a copy."""

    def __init__(self, svc: TargetService) -> None:
        self.svc = svc

    def run(self) -> None:
        """The thread's loop, until the service stops.
        Any store error is logged and the loop goes on: an error Redis answers (OOM under maxmemory, READONLY
        in a failover) ended this thread, silently stopping cancel flags and the heartbeat for good, so a
        live replica's runs all read as lost one lease later."""
        svc = self.svc
        beat_due, said, stuck, beaten = 0.0, "", False, time.monotonic()
        while not svc._stop:
            if svc._inbox and not svc._thread.is_alive():  # it died: nothing admits them
                svc._refuse_queued()
            if time.monotonic() >= beat_due and svc._thread.is_alive():
                beat_due = time.monotonic() + HEARTBEAT_S
                if stuck == svc.progress.moving():  # it changed: said once each way
                    stuck = not stuck
                    if stuck:
                        log.error("engine step running for %.0f s: heartbeat withheld, so the runs held "
                                  "here go to other replicas", svc.progress.stuck_for())
                    else:
                        log.warning("engine moving again: heartbeat resumed")
                if stuck and svc._refuse_queued():  # queued behind the stuck step: never admitted
                    log.warning("runs waiting for admission refused: the engine is stuck")
                if stuck or time.monotonic() - beaten > LEASE_S - HEARTBEAT_S:  # the lease may lapse
                    svc.records.suspect = svc.replica
                try:
                    if not stuck:
                        svc.tree.beat(svc.replica)
                        beaten = time.monotonic()
                except Exception as e:  # noqa: BLE001 — the next beat may be written
                    log.warning("heartbeat not written: %s: %s", type(e).__name__, e)
                if svc.records.suspect and beaten >= beat_due - HEARTBEAT_S:  # beaten just now
                    try:
                        self.check_held()
                    except Exception as e:  # noqa: BLE001 — the next beat checks again
                        log.warning("runs held here not checked for takeovers: %s: %s", type(e).__name__, e)
            time.sleep(svc.cancel_poll_s)
            ids = list(svc._sinks)
            if not ids:
                continue
            try:
                flagged = svc.tree.cancel_requested(ids)
            except Exception as e:  # noqa: BLE001 — read again next poll (said once per kind of error)
                if not isinstance(e, StoreUnavailable) and said != repr(e):
                    log.warning("cancel flags not read: %s: %s", type(e).__name__, e)
                said = repr(e)
                continue
            said = ""
            for rid, reason in flagged.items():
                svc._cancel_soon(rid, "cancelled", reason)

    def check_held(self) -> None:
        """After a beat that may have come too late (the lease may have lapsed meanwhile): the runs here
        that another replica took over are lost (``records.lose``: stopped, nothing more written); then
        writes go unchecked again. Raises what the read raises (the next beat checks again)."""
        svc = self.svc
        ids = list(svc._sinks)
        if ids and hasattr(svc.tree, "holders"):
            held = svc.tree.holders(ids)
            svc.records.lose({r: h for r, h in held.items() if h and h != svc.replica})
        svc.records.suspect = ""
