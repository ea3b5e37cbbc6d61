"""When the Target replica holding a run dies: which errors mean that, and how long the Coordinator
keeps trying to hand the run to a live replica (``Target.run(..., resume=True)`` rebuilds it there
from its tree in Redis).

A run is taken over at most ``max_resumes`` times. After a loss, the Coordinator re-sends the run
until some replica starts it (Serve's router may still pick the dead replica for a moment, or wait
for the replacement Serve starts), for at most ``wait_s``; then the run ends as ``failed`` and the
client gets UNAVAILABLE. A re-sent run that no replica starts (it waits in Serve's queue, or on a
replica that never admits it) gives up at that deadline too (``overdue``): it waited for ever.

A replica whose process lives on but whose engine stopped (its thread died, a step hung: it stops
beating, ``run_lease``) never fails the stream: its run's stream goes silent. The Coordinator reads the
run's lease while its stream is silent, and a lapsed one is a loss too (``LeaseLost``): the run is
taken over, that replica avoided.
"""

from __future__ import annotations

import asyncio
import time


class TargetLost(RuntimeError):
    """The run's replica died and no replica took the run over; the message says why."""


class LeaseLost(RuntimeError):
    """The replica holding the run stopped beating while its stream was silent (``replica``: its id)."""

    def __init__(self, replica: str) -> None:
        super().__init__(f"its Target replica {replica} stopped beating")
        self.replica = replica


def target_died(e: BaseException) -> bool:
    """True when ``e`` says the replica's process (or node) is gone, or its lease lapsed, not that the
    run failed there."""
    if isinstance(e, LeaseLost):
        return True
    from ray import exceptions as rx

    return isinstance(e, rx.RayActorError | rx.NodeDiedError | rx.WorkerCrashedError)


class Lost:
    """The replica losses of one run and the wait for a takeover."""

    def __init__(self, max_resumes: int = 2, wait_s: float = 120.0, retry_s: float = 0.5,
                 clock=time.monotonic) -> None:
        if max_resumes < 0 or wait_s <= 0 or retry_s <= 0:
            raise ValueError(f"max_resumes must be >= 0, wait_s and retry_s > 0; got {max_resumes}, "
                             f"{wait_s}, {retry_s}")
        self.max_resumes, self.wait_s, self.retry_s, self.clock = max_resumes, wait_s, retry_s, clock
        self.resumes = 0  # takeovers that started
        self.losses = 0
        self.deadline: float | None = None  # set while a takeover is being tried

    async def wait(self, e: BaseException) -> None:
        """Before the next takeover attempt: raise ``TargetLost`` when none may follow."""
        now = self.clock()
        if self.deadline is None:  # a new loss
            if self.losses >= self.max_resumes:
                raise TargetLost(f"target lost mid-run ({type(e).__name__}) {self.losses + 1} times; "
                                 f"a run is taken over at most {self.max_resumes} times")
            self.losses += 1
            self.deadline = now + self.wait_s
            return
        if now >= self.deadline:
            raise TargetLost(f"target lost mid-run ({type(e).__name__}) and no replica took the run "
                             f"over within {self.wait_s:g} s")
        await asyncio.sleep(min(self.retry_s, self.deadline - now))

    def overdue(self) -> TargetLost | None:
        """While a takeover is tried: the ``TargetLost`` to raise once ``wait_s`` passed with no replica
        starting the re-sent run, else None."""
        if self.deadline is None or self.clock() < self.deadline:
            return None
        return TargetLost(f"target lost mid-run and no replica took the run over within {self.wait_s:g} s")

    def taken_over(self) -> None:
        self.resumes += 1
        self.deadline = None
