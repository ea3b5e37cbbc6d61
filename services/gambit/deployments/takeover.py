"""When the Target replica holding a run dies: which errors mean that, and how long the Coordinator
keeps trying to hand the run to a live replica (``Target.run(..., resume=True)`` rebuilds it there
from its tree in Redis).

A run is taken over at most ``max_resumes`` times. After a loss, the Coordinator re-sends the run
until some replica starts it (Serve's router may still pick the dead replica for a moment, or wait
for the replacement Serve starts), for at most ``wait_s``; then the run ends as ``failed`` and the
client gets UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import time


class TargetLost(RuntimeError):
    """The run's replica died and no replica took the run over; the message says why."""


def target_died(e: BaseException) -> bool:
    """True when ``e`` says the replica's process (or node) is gone, not that the run failed there."""
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

    def taken_over(self) -> None:
        self.resumes += 1
        self.deadline = None
