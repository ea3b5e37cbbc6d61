"""The Target's in-process scorer (embedded wiring, ``gambit.serving.embedded``): the ``BoundaryScorer``
itself behind the counters and metrics a ``RemoteScorer`` keeps, so the driver and the run records treat
both alike. No network, so no fallback: a scorer error is the caller's."""

from __future__ import annotations

import time


class LocalScorer:
    """An in-process ``BoundaryScorer`` with the same timing counters (embedded wiring)."""

    def __init__(self, scorer, metrics=None) -> None:
        self.inner, self.metrics = scorer, metrics
        self.kind, self.hidden_size = scorer.kind, scorer.hidden_size
        # a scorer that also reads the target's sampled-token confidence: the driver appends it
        self.confidence = bool(getattr(scorer, "confidence", False))
        self.sync_seconds = 0.0
        self.calls = 0
        self.fallbacks = 0

    def score(self, keys, states):
        t0 = time.perf_counter()
        out = self.inner.score(list(keys), states)
        dt = time.perf_counter() - t0
        self.sync_seconds += dt
        self.calls += 1
        if self.metrics is not None:  # in process: the scorer's call is the Target's wait
            self.metrics.observe("gambit_scorer_latency_seconds", dt)
            self.metrics.observe("gambit_scorer_batch_size", len(keys))
            self.metrics.observe("gambit_guidance_sync_seconds", dt)
        return out

    def fork(self, parent_key, child_key) -> None:
        self.inner.drop(child_key)
        self.inner.fork(parent_key, child_key)

    def drop(self, key) -> None:
        self.inner.drop(key)
