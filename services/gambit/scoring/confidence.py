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

import torch

FEATURES = 2  # appended to the hidden state when a scorer's config has ``confidence``
CLIP = -20.0  # log-probabilities below this are clipped (an impossible token gives -inf)
SCALE = 1.0  # features are plain log-probabilities in nats (scaled down, the probe learned them slowly)


def features(thought_min: float, trace_min: float) -> list[float]:
    return [max(thought_min, CLIP) / SCALE, max(trace_min, CLIP) / SCALE]


class ConfidenceTracker:
    """One trace's sampled-token log-probabilities since its last boundary, and its running minimum.

    Positions make it independent of event order within an engine step (the boundary token's state
    arrives a step after the token was sampled, possibly after the next token's event).
    """

    __slots__ = ("pending", "trace_min")

    def __init__(self, pending: list[tuple[int, float]] | None = None, trace_min: float = 0.0) -> None:
        self.pending = pending or []
        self.trace_min = trace_min

    def token(self, position: int, logprob: float | None) -> None:
        if logprob is not None:
            self.pending.append((position, logprob))

    def boundary(self, position: int) -> list[float]:
        """The features of the boundary whose token sits at ``position`` (it closes the thought)."""
        mine = [lp for p, lp in self.pending if p <= position]
        self.pending = [(p, lp) for p, lp in self.pending if p > position]
        thought = min(mine, default=0.0)
        self.trace_min = min(self.trace_min, thought)
        return features(thought, self.trace_min)

    def fork(self) -> ConfidenceTracker:
        return ConfidenceTracker(list(self.pending), self.trace_min)


def with_confidence(states: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` hidden states and ``[N, FEATURES]`` features → the scorer input ``[N, d + FEATURES]``."""
    return torch.cat([states.float(), feats.to(torch.float32)], dim=1)
