"""DeepConf online: token confidence from top-k log-probabilities, a sliding window, a threshold.

Token confidence is ``-mean(top-k logprobs)`` (higher = more confident). A trace's group confidence
is the mean over the last ``window`` tokens; warm-up traces set the threshold at a percentile of
their lowest group confidence, and a later trace stops once its window mean falls below it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np


def token_confidence(top_logprobs: Sequence[tuple[int, float]]) -> float:
    if not top_logprobs:
        raise ValueError("token confidence needs top log-probabilities (SamplingParams.logprobs > 0)")
    return -sum(lp for _, lp in top_logprobs) / len(top_logprobs)


class ConfidenceWindow:
    """Running window mean, its lowest value once full, and the mean over the whole trace."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.values: deque[float] = deque()
        self.sum = 0.0
        self.total = 0.0
        self.count = 0
        self.lowest: float | None = None

    def push(self, conf: float) -> float | None:
        """Add a token's confidence; returns the window mean once the window is full."""
        self.values.append(conf)
        self.sum += conf
        self.total += conf
        self.count += 1
        if len(self.values) > self.window:
            self.sum -= self.values.popleft()
        if len(self.values) < self.window:
            return None
        mean = self.sum / self.window
        self.lowest = mean if self.lowest is None else min(self.lowest, mean)
        return mean

    def lowest_or_mean(self) -> float | None:
        """Lowest full-window mean; a trace shorter than the window gives its overall mean."""
        if self.lowest is not None:
            return self.lowest
        return self.total / self.count if self.count else None

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def threshold(lowest_confidences: Sequence[float], keep_percent: float) -> float:
    """Keep the top ``keep_percent`` of warm-up traces: the (100 - keep) percentile of their lowest."""
    vals = [v for v in lowest_confidences if v is not None]
    if not vals:
        return float("-inf")
    return float(np.percentile(np.asarray(vals, dtype=np.float64), 100.0 - keep_percent))


def vote_weights(lowest_confidences: Sequence[float | None], bar: float | None) -> list[float]:
    """The reference's online vote (deepconf-online.py): a finished trace votes with its lowest group
    confidence, and only when that is at or above the threshold; below it (a warm-up trace, or a later
    one shorter than the window, never checked while it ran: its lowest is its overall mean, as the
    reference's ``compute_least_grouped``), or with no confidence (None), it gets 0. ``bar`` None: no
    threshold set, every trace with a confidence votes."""
    floor = float("-inf") if bar is None else bar
    return [0.0 if v is None or v < floor else float(v) for v in lowest_confidences]
