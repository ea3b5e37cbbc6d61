"""Calls in flight on a server, as a time-weighted mean: the load Ray Serve's autoscaler should see.

Serve counts only the requests that pass its proxy or a handle. A Target's Score calls to a Scorer
replica's own gRPC endpoint (``scorer_endpoints``) pass neither, so the replica reports these itself
(``Scorer.record_autoscaling_stats``). A mean over the time since the last read, not a sample: a Target's
call is in flight a few ms out of every ~10, and a sample taken every few seconds read 0 or 1 by chance.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class OngoingCalls:
    """``with calls:`` around each call; ``mean()`` reads the mean number in flight since its last read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._now = 0
        self._area = 0.0  # calls x seconds since the window opened
        self._last = self._since = clock()

    @property
    def now(self) -> int:
        """Calls in flight at this moment."""
        return self._now

    def _advance(self, t: float) -> None:
        self._area += self._now * (t - self._last)
        self._last = t

    def __enter__(self) -> OngoingCalls:
        with self._lock:
            self._advance(self._clock())
            self._now += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._advance(self._clock())
            self._now -= 1

    def mean(self) -> float:
        """Mean calls in flight since the previous ``mean()`` (or since creation), then a new window; the
        count at this moment where no time has passed."""
        with self._lock:
            t = self._clock()
            self._advance(t)
            span = t - self._since
            out = self._area / span if span > 0 else float(self._now)
            self._area, self._since = 0.0, t
            return out
