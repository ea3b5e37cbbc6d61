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
    tokens come in position order, so positions and log-probabilities are two parallel lists, split
    at a boundary by bisection: no tuple per token (the search adds every generated token here).
    """

    __slots__ = ("positions", "logprobs", "trace_min")

    def __init__(self, positions: list[int] | None = None, logprobs: list[float] | None = None,
                 trace_min: float = 0.0) -> None:
        self.positions = positions if positions is not None else []
        self.logprobs = logprobs if logprobs is not None else []
        self.trace_min = trace_min

    def token(self, position: int, logprob: float | None) -> None:
        if logprob is not None:
            self.positions.append(position)
            self.logprobs.append(logprob)

    def tokens(self, start: int, logprobs: list[float]) -> None:
        """The log-probabilities of the tokens at ``start``, ``start + 1``, ... (none missing)."""
        self.positions.extend(range(start, start + len(logprobs)))
        self.logprobs.extend(logprobs)

    def boundary(self, position: int) -> list[float]:
        """The features of the boundary whose token sits at ``position`` (it closes the thought)."""
        n = bisect_right(self.positions, position)
        thought = min(self.logprobs[:n], default=0.0)
        del self.positions[:n], self.logprobs[:n]
        self.trace_min = min(self.trace_min, thought)
        return features(thought, self.trace_min)

    def fork(self) -> ConfidenceTracker:
        return ConfidenceTracker(list(self.positions), list(self.logprobs), self.trace_min)


def with_confidence(states: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` hidden states and ``[N, FEATURES]`` features → the scorer input ``[N, d + FEATURES]``."""
    return torch.cat([states.float(), feats.to(torch.float32)], dim=1)
