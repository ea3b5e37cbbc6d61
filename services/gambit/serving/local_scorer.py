"""The Target's in-process scorer (embedded wiring, ``gambit.serving.embedded``): the ``BoundaryScorer``
itself behind the counters and metrics a ``RemoteScorer`` keeps, so the driver and the run records treat
both alike. No network, so no fallback: a scorer error is the caller's. Rows the Scorer service refuses
(``scorer_core.bad_rows``: a NaN state) are left out as the ``RemoteScorer`` leaves them out, each
scored its trace's running mean: one such row raised, and the driver's step failed every run."""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from gambit.serving.limits import MAX_KEYS
from gambit.serving.scorer_core import BAD_ROWS_LOG_S, bad_rows, warn_bad_rows


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
        self.bad_rows = 0  # rows left out (``bad_rows``), each scored its trace's running mean
        self._sum: dict = {}  # key -> (sum, count) of its scores: a left-out row's score is their mean
        self._bad_logged_at = -math.inf

    def score(self, keys, states):
        keys = list(keys)
        t0 = time.perf_counter()
        bad = bad_rows(states, self.hidden_size) if isinstance(states, torch.Tensor) and states.dim() == 2 \
            and states.dtype.is_floating_point and states.shape[0] == len(keys) else []  # else its error
        sent = keys
        if bad:
            self._note_bad(keys, bad)
            left_out = set(bad)
            keep = [i for i in range(len(keys)) if i not in left_out]
            sent, states = [keys[i] for i in keep], states[keep]
        out = self.inner.score(sent, states)
        got, sums = out.tolist(), self._sum
        for k, s in zip(sent, got, strict=True):
            tot, n = sums.get(k, (0.0, 0))
            sums[k] = (tot + s, n + 1)
        while len(sums) > MAX_KEYS:  # keys never dropped (a run's last ghosts): the oldest forgotten
            del sums[next(iter(sums))]
        if bad:
            it = iter(got)
            out = torch.from_numpy(np.asarray([self._mean(k) if i in left_out else next(it)
                                               for i, k in enumerate(keys)], dtype=np.float32))
        dt = time.perf_counter() - t0
        self.sync_seconds += dt
        self.calls += 1
        if self.metrics is not None:  # in process: the scorer's call is the Target's wait
            self.metrics.observe("gambit_scorer_latency_seconds", dt)
            self.metrics.observe("gambit_scorer_batch_size", len(keys))
            self.metrics.observe("gambit_guidance_sync_seconds", dt)
        return out

    def _mean(self, key) -> float:
        tot, n = self._sum.get(key, (0.0, 0))
        return tot / n if n else 0.5

    def _note_bad(self, keys: list, bad: list[int]) -> None:
        self.bad_rows += len(bad)
        if self.metrics is not None:  # the log says it once a minute; the counter and its alert each time
            self.metrics.inc("gambit_scorer_bad_rows_total", len(bad))
        now = time.monotonic()
        if now < self._bad_logged_at + BAD_ROWS_LOG_S:
            return
        self._bad_logged_at = now
        warn_bad_rows(keys, bad, self.bad_rows)

    def fork(self, parent_key, child_key) -> None:
        self.inner.drop(child_key)
        self.inner.fork(parent_key, child_key)
        if parent_key in self._sum:  # the child's boundaries so far are its parent's (as ``RemoteScorer``)
            self._sum[child_key] = self._sum[parent_key]
        else:
            self._sum.pop(child_key, None)

    def drop(self, key) -> None:
        self.inner.drop(key)
        self._sum.pop(key, None)
