"""The target's confidence in the tokens it sampled, as extra scorer inputs at a boundary.

The shipped target's boundary state does not encode whether its own arithmetic was right (a scorer
reading it alone is at chance within a problem), but its next-token distribution does: a wrong
``a op b = c`` line is nearly always a low-probability digit that was sampled anyway. That
probability is the target's hidden state at the previous position read through its own LM head,
so a scorer that gets it still reads only the target. Two numbers per boundary: the lowest
log-probability of a token sampled in the thought this boundary closes, and the lowest over the
trace so far (what "every thought so far is right" depends on), both clipped and scaled.
"""

from __future__ import annotations

from bisect import bisect_right

import torch

FEATURES = 2  # appended to the hidden state when a scorer's config has ``confidence``
CLIP = -20.0  # log-probabilities below this are clipped (an impossible token gives -inf)
SCALE = 1.0  # features are plain log-probabilities in nats (scaled down, the probe learned them slowly)


def features(thought_min: float, trace_min: float) -> list[float]:
    return [max(thought_min, CLIP) / SCALE, max(trace_min, CLIP) / SCALE]


class ConfidenceTracker:
    """One trace's sampled-token log-probabilities since its last boundary, and its running minimum.

    Positions make it independent of event order within an engine step (the boundary token's state
    arrives a step after the token was sampled, possibly after the next token's event). A trace's
    tokens come in position order with none missing, so the log-probabilities are kept as one list
    from position ``start`` and split at a boundary by subtraction: no position per token (the search
    adds every generated token here). Tokens that leave a gap (a ``token`` without a log-probability)
    keep their positions in a list, split by bisection, until a boundary empties it.
    """

    __slots__ = ("start", "logprobs", "trace_min", "_positions")

    def __init__(self, positions: list[int] | None = None, logprobs: list[float] | None = None,
                 trace_min: float = 0.0) -> None:
        self.logprobs = logprobs if logprobs is not None else []
        self.trace_min = trace_min
        self.start = positions[0] if positions else 0  # the position of ``logprobs[0]``
        self._positions = None  # the positions, only while they are not start, start + 1, ...
        if positions and positions != list(range(self.start, self.start + len(positions))):
            self._positions = positions

    @property
    def positions(self) -> list[int]:
        """The position of each kept log-probability (a new list while they are consecutive, so
        ``del c.positions[-k:], c.logprobs[-k:]`` forgets the last k tokens either way)."""
        if self._positions is not None:
            return self._positions
        return list(range(self.start, self.start + len(self.logprobs)))

    def _append_at(self, position: int) -> None:
        """Before log-probabilities from ``position`` on join: start there, or keep positions past a gap."""
        if self._positions is None:
            if not self.logprobs:
                self.start = position
            elif position != self.start + len(self.logprobs):
                self._positions = list(range(self.start, self.start + len(self.logprobs)))

    def token(self, position: int, logprob: float | None) -> None:
        if logprob is not None:
            self._append_at(position)
            if self._positions is not None:
                self._positions.append(position)
            self.logprobs.append(logprob)

    def tokens(self, start: int, logprobs: list[float]) -> None:
        """The log-probabilities of the tokens at ``start``, ``start + 1``, ... (none missing)."""
        if not logprobs:
            return
        self._append_at(start)
        if self._positions is not None:
            self._positions.extend(range(start, start + len(logprobs)))
        self.logprobs.extend(logprobs)

    def boundary(self, position: int) -> list[float]:
        """The features of the boundary whose token sits at ``position`` (it closes the thought)."""
        if self._positions is None:
            n = min(max(position + 1 - self.start, 0), len(self.logprobs))
            self.start += n
        else:
            n = bisect_right(self._positions, position)
            del self._positions[:n]
            if not self._positions:
                self._positions = None
        thought = min(self.logprobs[:n], default=0.0)
        del self.logprobs[:n]
        self.trace_min = min(self.trace_min, thought)
        return features(thought, self.trace_min)

    def fork(self) -> ConfidenceTracker:
        c = ConfidenceTracker(None, list(self.logprobs), self.trace_min)
        c.start = self.start
        c._positions = None if self._positions is None else list(self._positions)
        return c


def with_confidence(states: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` hidden states and ``[N, FEATURES]`` features → the scorer input ``[N, d + FEATURES]``."""
    return torch.cat([states.float(), feats.to(torch.float32)], dim=1)
