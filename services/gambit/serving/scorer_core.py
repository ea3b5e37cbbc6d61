"""What every ScorerService replica does: validate a request, batch it with others, score, answer.

Shared by the standalone gRPC server (``scorer_server.py``) and the Ray Serve ``Scorer``
deployment, so both give the same answers and the same INVALID_ARGUMENT messages.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from gambit.serving.limits import MAX_PENDING
from gambit.serving.metrics import Metrics
from gambit.serving.payload import (
    LOGPROB_SLACK,
    MAX_STATE,
    check_ids,
    decode_features,
    decode_states,
    states_with_features,
)

log = logging.getLogger(__name__)

BAD_ROWS_LOG_S = 60.0  # the warning about rows left out (NaN states) is said at most this often
SCORE_TIMEOUT_S = 30.0  # how long a Score call waits for its batch at most (a Target gives up after 2 s)


def timed_out(timeout: float | None) -> str:
    return f"timed out after {timeout:g} s waiting for the scorer (busy or stuck)"


def max_edits(max_rows: int) -> int:
    """Most forks + drops one request may carry. A round's forks and drops are a few per row, but a
    Target whose Scorer was down sends up to ``MAX_PENDING`` queued ones (plus a round's) in its next
    call, and a refused call keeps them queued: below that it would be refused for good."""
    return max(32 * max_rows, 2 * MAX_PENDING)


def bad_rows(states: torch.Tensor, hidden_size: int) -> list[int]:
    """The rows of ``states [N, hidden_size + features]`` a ScorerService refuses (``decode_states``,
    ``decode_features``): a NaN or infinity, a hidden value past ``MAX_STATE``, a feature above 0. A
    Target's scorer (remote or in-process) scores the other rows and gives these their trace's running
    mean: one such row refused the whole call, every trace of it scored 0.5 and the client backed off.
    On the CPU in numpy: a torch reduction past ATen's grain size (64 rows of width 578) woke the OpenMP
    pool, ~0.8 ms on a loaded 2-core machine where numpy's min and max take ~7 us."""
    if not states.numel():
        return []
    a = _values(states.detach())
    lo, hi = a.min(), a.max()  # NaN fails both comparisons; the features (log-probabilities clipped at
    ok = -MAX_STATE <= lo and hi <= MAX_STATE  # -20, ``confidence.CLIP``) are in range when the states are
    if ok and a.shape[1] > hidden_size:
        ok = a[:, hidden_size:].max() <= LOGPROB_SLACK
    if ok:
        return []
    good = (abs(a[:, :hidden_size]) <= MAX_STATE).all(1)
    if a.shape[1] > hidden_size:
        f = a[:, hidden_size:]
        good &= ((f > -math.inf) & (f <= LOGPROB_SLACK)).all(1)
    if isinstance(good, np.ndarray):
        return np.flatnonzero(~good).tolist()
    return (~good).nonzero()[:, 0].tolist()


def warn_bad_rows(keys: list, bad: list[int], total: int) -> None:
    """The WARNING a Target's scorer (remote or in-process) gives for the rows ``bad_rows`` left out; its
    caller says it at most every ``BAD_ROWS_LOG_S`` (the counter ``gambit_scorer_bad_rows_total`` each
    time)."""
    named = ", ".join(repr(keys[i]) for i in bad[:4]) + (" ..." if len(bad) > 4 else "")
    log.warning("%d of %d boundary states hold NaN, infinity or values past %g (traces %s): not scored, each "
                "gets its trace's running mean (%d such rows so far)", len(bad), len(keys), MAX_STATE, named,
                total)


def _values(t: torch.Tensor):
    """A CPU tensor's values as a numpy array (bfloat16: float32's top 16 bits; float16 as float32: numpy's
    float16 min and max are ~50x slower), else the tensor."""
    if t.device.type != "cpu":
        return t
    if t.dtype == torch.bfloat16:
        bits = t.contiguous().view(torch.int16).numpy().view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return t.numpy().astype(np.float32, copy=False) if t.dtype == torch.float16 else t.numpy()


def feature_count(scorer) -> int:
    """Confidence features a scorer reads per row beside the hidden state (0: none)."""
    return scorer.input_size - scorer.hidden_size if getattr(scorer, "confidence", False) else 0


@dataclass
class ScoreJob:
    states: torch.Tensor
    keys: list[str]
    forks: list[tuple[str, str]]
    drops: list[str]
    future: Future
    submitted: float = 0.0  # perf_counter at submit: the call's latency counts its queue and batch wait


class ScorerCore:
    """Validation + micro-batching over one ``BoundaryScorer``.

    Requests arriving within ``batch_wait_s`` of each other (up to ``max_batch_rows`` rows) are
    scored by one ``score`` call. Rows keep their request's order, so a sequence scorer sees each
    key's boundaries in order. A batch applies all its forks, scores, then applies all its drops: it
    closes before a request whose keys or forks touch an earlier one's (``_joins``), so every request
    is answered as if served alone, in arrival order.
    """

    def __init__(self, scorer, max_rows: int = 4096, batch_wait_s: float = 0.002,
                 max_batch_rows: int = 1024, metrics: Metrics | None = None) -> None:
        self.scorer = scorer
        self.max_rows = max_rows
        self.batch_wait_s = batch_wait_s
        self.max_batch_rows = max_batch_rows
        self.metrics = metrics
        self._cv = threading.Condition()
        self._queue: list[ScoreJob] = []
        self._closed = False
        self.calls = 0
        self._evicted = getattr(scorer, "evicted", 0)  # the scorer's count the metric has seen
        self._thread = threading.Thread(target=self._loop, name="scorer-batcher", daemon=True)
        self._thread.start()

    @property
    def features(self) -> int:
        """Confidence features per row the scorer reads (``ScoreRequest.features``; 0: none)."""
        return feature_count(self.scorer)

    def validate(self, states: bytes, dtype: str, shape, trace_ids, forks=(), drops=(),
                 features=()) -> ScoreJob:
        """A job ready to submit, or ValueError naming the bad field."""
        if len(forks) + len(drops) > (most := max_edits(self.max_rows)):  # before reading any of them
            field = "forks" if len(forks) >= len(drops) else "drops"
            raise ValueError(f"{field}: {len(forks)} forks + {len(drops)} drops in one request, at most "
                             f"{most} together")
        t = decode_states(states, dtype, shape, list(trace_ids), self.scorer.hidden_size, self.max_rows)
        t = states_with_features(t, decode_features(features, t.shape[0], self.features))
        fk = [(f.parent, f.child) for f in forks]
        check_ids("forks", [k for f in fk for k in f])  # first: a bad fork's message quotes its ids
        for parent, child in fk:
            if parent == child:
                raise ValueError(f"forks: bad fork {parent!r} -> {child!r}")
        check_ids("drops", drops)
        return ScoreJob(t, list(trace_ids), fk, list(drops), Future())

    def submit(self, job: ScoreJob) -> Future:
        with self._cv:
            if self._closed:
                raise RuntimeError("scorer is shut down")
            job.submitted = time.perf_counter()
            self._queue.append(job)
            self._cv.notify()
        return job.future

    def score(self, job: ScoreJob, timeout: float | None = SCORE_TIMEOUT_S) -> torch.Tensor:
        fut = self.submit(job)
        try:
            return fut.result(timeout)
        except TimeoutError:  # its str() is empty: the server answered "scoring failed: "
            fut.cancel()  # not scored for nobody if still queued
            raise TimeoutError(timed_out(timeout)) from None

    async def score_async(self, job: ScoreJob, timeout: float | None = SCORE_TIMEOUT_S) -> torch.Tensor:
        """``score`` for an asyncio handler (the Ray deployment); cancelling it cancels the job while
        it is queued."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(job)), timeout)
        except TimeoutError:
            raise TimeoutError(timed_out(timeout)) from None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop taking jobs and wait for the batcher to end. Joined, not left running as a daemon: the
        last reference to this core (and its scorer's tensors) could otherwise be dropped in that thread
        while the interpreter exits, and torch's dealloc there aborted the process."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _take(self) -> list[ScoreJob] | None:
        """The next batch ([] when all its jobs were cancelled); None once closed and drained."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if not self._queue:
                return None
            deadline = time.monotonic() + self.batch_wait_s
            while sum(len(j.keys) for j in self._queue) < self.max_batch_rows:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            jobs, rows, seen, dropped = [], 0, set(), set()
            while self._queue and (not jobs or (rows + len(self._queue[0].keys) <= self.max_batch_rows
                                                and _joins(self._queue[0], seen, dropped))):
                job = self._queue.pop(0)
                # running from here on: a caller that gives up later cannot cancel it under the batcher
                # (a cancelled Ray request cancelled its future, and set_result on it raised
                # InvalidStateError: the batcher thread died, and the replica never answered again)
                if not job.future.set_running_or_notify_cancel():
                    continue  # cancelled while queued: not scored (its caller re-sends forks and drops)
                rows += len(job.keys)
                seen.update(job.keys, job.drops)
                dropped.update(job.drops)
                jobs.append(job)
            return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            if not jobs:
                continue
            try:
                for j in jobs:
                    for parent, child in j.forks:
                        self.scorer.drop(child)
                        self.scorer.fork(parent, child)
                keys = [k for j in jobs for k in j.keys]
                # N = 0 (forks and drops only): no forward, some scorers refuse an empty batch
                out = (self.scorer.score(keys, torch.cat([j.states for j in jobs])) if keys
                       else torch.zeros(0))
                for j in jobs:
                    for d in j.drops:
                        self.scorer.drop(d)
            except Exception as e:  # noqa: BLE001 — every waiting caller gets the error
                for j in jobs:
                    j.future.set_exception(e)
                continue
            finally:
                self._count_evictions()
            self.calls += 1
            i, done = 0, time.perf_counter()
            for j in jobs:
                if self.metrics is not None:  # per Score call: its rows; its queue + batch wait + forward
                    self.metrics.observe("gambit_scorer_latency_seconds", done - j.submitted)
                    self.metrics.observe("gambit_scorer_batch_size", len(j.keys))
                j.future.set_result(out[i:i + len(j.keys)])
                i += len(j.keys)

    def _count_evictions(self) -> None:
        """The histories a sequence scorer forgot in this batch (beyond its ``max_keys``), as a counter:
        its log line is said once, and a trace that lost its history scores as a new one."""
        evicted = getattr(self.scorer, "evicted", 0)
        if self.metrics is not None and evicted > self._evicted:
            self.metrics.inc("gambit_scorer_evictions_total", evicted - self._evicted)
        self._evicted = evicted


def _joins(job: ScoreJob, seen: set[str], dropped: set[str]) -> bool:
    """Whether ``job`` may share a batch with the earlier jobs (their keys and drops ``seen``, their
    drops ``dropped``): its forks move before their rows and drops, their drops after its rows."""
    forked = {k for f in job.forks for k in f}
    return not (forked & seen) and not (dropped & set(job.keys))
