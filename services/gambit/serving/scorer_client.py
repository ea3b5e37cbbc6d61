"""The Target's side of ScorerService: a ``BoundaryScorer``-shaped client with a stated fallback.

``score(keys, states)`` sends one Score RPC (raw bytes + dtype + shape; forks and drops queued since the
last call ride along), or several in a row where the rows exceed the Scorer's ``max_rows`` (its Info).
``confidence``: the ScorerService's scorer reads the target's sampled-token confidence (the served
default, ``scorer-process``, does): the driver appends it to each row, as for an in-process scorer, and
it travels as ``ScoreRequest.features``. If the scorer is unreachable (any RPC error or timeout), the
call is answered by the **fallback**: each row gets its trace's running mean of the scores the scorer
gave before (0.5 for a trace it never scored), so the round ranks traces as the scorer last saw them and
new boundaries neither help nor hurt. ``gambit_scorer_fallback_total`` counts such calls; after a failure
the client skips the network for ``retry_after_s`` before trying again, doubled for each failure in a row
up to ``MAX_RETRY_AFTER_S``. Forks and drops stay queued until a call carries them through (a retried
fork or drop is harmless: the Scorer drops a fork's child first), so a failed call costs its own scores,
not the history of every trace forked meanwhile. A row the Scorer would refuse (``scorer_core.bad_rows``: a
NaN state) is not sent: it gets its trace's running mean and the call scores the others, as in process
(``LocalScorer``); ``bad_rows`` counts such rows.

Before the first Score call, and again after a failed one, the client asks the Scorer's ``Info``: a
Scorer that reads another hidden width or another number of features refuses every call, so each run
would end "done" on fallback scores. Then an ERROR line names both widths and the address, the call falls
back (and backs off) as any failed one, and ``unguided`` says why, for the runs' results.

Where the calls go (the proxy, or a replica's direct endpoint while it answers) and the channels kept to
each: ``scorer_endpoints.ScorerEndpoints``, which a ``RemoteScorer`` is.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future

import grpc
import numpy as np
import torch

from gambit.scoring.confidence import FEATURES
from gambit.serving.limits import MAX_PENDING
from gambit.serving.payload import check_ids, encode_states
from gambit.serving.scorer_core import BAD_ROWS_LOG_S, bad_rows, warn_bad_rows
from gambit.serving.scorer_endpoints import ScorerEndpoints
from gambit.serving.security import auth_metadata

log = logging.getLogger(__name__)

# longest back-off after failed calls in a row: a hung Scorer (each try waits out the timeout on the direct
# endpoint and on the proxy) made runs 3.3x slower at a fixed 1 s; a Scorer back within 30 s is used again
MAX_RETRY_AFTER_S = 30.0
MAX_DOUBLINGS = 32  # failures in a row the back-off counts (beyond, it stays at ``MAX_RETRY_AFTER_S``)


def as_float32(raw: bytes, dtype: str) -> bytes:
    """Encoded states (``encode_states``) as float32 bytes, exactly (numpy: no ATen work on the sender)."""
    if dtype == "float32":
        return raw
    if dtype == "bfloat16":  # float32's top 16 bits
        return (np.frombuffer(raw, dtype="<u2").astype("<u4") << 16).tobytes()
    return np.frombuffer(raw, dtype="<f2").astype("<f4").tobytes()


class RemoteScorer(ScorerEndpoints):
    def __init__(self, address: str, hidden_size: int, kind: str = "remote", token: str = "",
                 application: str = "", timeout_s: float = 2.0, retry_after_s: float = 1.0,
                 tls_ca: str = "", metrics=None, resolve: Callable[[], str] | None = None,
                 refresh_s: float = 60.0, confidence: bool = False, tls_cert: str = "", tls_key: str = "",
                 tls_server_name: str = "") -> None:
        """``resolve``: returns a replica's direct ScorerService address ("" for none); it is called
        off the scoring path, at start, every ``refresh_s`` and after the direct endpoint fails.
        Calls go there while it answers, else to ``address`` (the proxy). ``tls_*``: a TLS Scorer's CA,
        this client's certificate and key (mTLS) and the name its certificate holds (``open_channel``)."""
        super().__init__(address, tls_ca, tls_cert, tls_key, tls_server_name, resolve, refresh_s,
                         retry_after_s)
        self.metadata = auth_metadata(token) + ((("application", application),) if application else ())
        self.hidden_size, self.kind = hidden_size, kind
        self.confidence = confidence  # the driver appends the confidence features (``ScoreRequest.features``)
        self.width = hidden_size + (FEATURES if confidence else 0)  # of the rows ``score`` takes
        self.timeout_s, self.retry_after_s, self.metrics = timeout_s, retry_after_s, metrics
        self._forks: list[tuple[str, str]] = []
        self._drops: list[str] = []
        self._sum: dict[str, tuple[float, int]] = {}
        # keys dropped lately (at most MAX_PENDING): a score that lands after its trace's drop is not kept
        self._dropped: OrderedDict[str, None] = OrderedDict()
        self._down_until = 0.0
        self._failures = 0  # failed calls in a row (the back-off doubles with each)
        self._lock = threading.Lock()
        self.sync_seconds = 0.0  # guidance sync: time inside Score calls
        self.calls = 0
        self.fallbacks = 0
        self.last_error = ""
        self.unguided = ""  # why every call falls back: the Scorer reads other rows than this Target sends
        self._info_ok = False  # the Scorer's Info matched (asked again after a failed call)
        self.max_rows = 0  # rows one Score call may carry, from the Scorer's Info (0: not said)
        # (keys, keys sent, their encoded states, features, rows left out, future) per score_async call not
        # sent yet
        self._queue: list[tuple[list[str], list[str], tuple[bytes, str, list[int]], list[float], list[int],
                                Future]] = []
        self.bad_rows = 0  # rows never sent: the Scorer refuses them (``bad_rows``); each scored its mean
        self._bad_logged_at = -math.inf
        self._wake = threading.Condition(self._lock)
        self._sender: threading.Thread | None = None
        self._closed = False
        self._maybe_resolve()

    def fork(self, parent_key: Hashable, child_key: Hashable) -> None:
        parent, child = str(parent_key), str(child_key)
        # the Scorer refuses it (``ScorerCore.validate``): kept for a retry, it would fail every later call
        if not parent or not child or parent == child:
            raise ValueError(f"fork: bad fork {parent!r} -> {child!r}")
        check_ids("fork", (parent, child))  # an id over the Scorer's limit
        with self._lock:
            self._forks.append((parent, child))
            if parent in self._sum:
                self._sum[child] = self._sum[parent]
            else:  # the Scorer drops the child's history first: its old scores are not its mean either
                self._sum.pop(child, None)

    def drop(self, key: Hashable) -> None:
        key = str(key)
        check_ids("drop", (key,))
        with self._lock:
            self._drops.append(key)
            self._sum.pop(key, None)
            self._dropped[key] = None
            if len(self._dropped) > MAX_PENDING:
                self._dropped.popitem(last=False)

    def _encode(self, keys: list[str], states: torch.Tensor) -> tuple[list[str], tuple, list[float],
                                                                      list[int]]:
        """The keys to send, their hidden states as a payload (``encode_states``), their features as
        floats and the rows left out (``bad_rows``: the Scorer refuses them), or ValueError."""
        if states.dim() != 2 or states.shape[0] != len(keys) or states.shape[1] != self.width:
            extra = f" (hidden {self.hidden_size} + {FEATURES} confidence)" if self.confidence else ""
            raise ValueError(f"states must be [{len(keys)}, {self.width}]{extra}, got {tuple(states.shape)}")
        if bad := bad_rows(states, self.hidden_size):
            self._note_bad(keys, bad)
            out = set(bad)
            keep = [i for i in range(len(keys)) if i not in out]
            keys, states = [keys[i] for i in keep], states[keep]
        if not self.confidence:
            return keys, encode_states(states), [], bad
        feats = states[:, self.hidden_size:].reshape(-1).tolist()
        return keys, encode_states(states[:, :self.hidden_size]), feats, bad

    def _note_bad(self, keys: list[str], bad: list[int]) -> None:
        """Count the rows left out and say so (a WARNING at most every ``BAD_ROWS_LOG_S``; the counter
        ``gambit_scorer_bad_rows_total`` and its alert every time: a model emitting NaN is an outage)."""
        if self.metrics is not None:
            self.metrics.inc("gambit_scorer_bad_rows_total", len(bad))
        with self._lock:
            self.bad_rows += len(bad)
            now = time.monotonic()
            if now < self._bad_logged_at + BAD_ROWS_LOG_S:
                return
            self._bad_logged_at = now
        warn_bad_rows(keys, bad, self.bad_rows)

    def _with_bad(self, keys: list[str], bad: list[int], scores: torch.Tensor) -> torch.Tensor:
        """``scores`` of the rows sent, with each left-out row's running mean put back in its place
        (numpy: no ATen work on the sender thread)."""
        if not bad:
            return scores
        got, out = iter(scores.tolist()), set(bad)
        with self._lock:
            vals = [self._mean(k) if i in out else next(got) for i, k in enumerate(keys)]
        return torch.from_numpy(np.asarray(vals, dtype=np.float32))

    def score(self, keys: Sequence[Hashable], states: torch.Tensor) -> torch.Tensor:
        with self._lock:  # as ``score_async``: its channels are closed (one asked again stayed open)
            if self._closed:
                raise RuntimeError("scorer client is closed")
        keys = [str(k) for k in keys]
        sent, enc, feats, bad = self._encode(keys, states)
        return self._with_bad(keys, bad, self._score_raw(sent, *enc, feats))

    def _score_raw(self, keys: list[str], raw: bytes, dtype: str, shape: list[int],
                   features: list[float] | None = None) -> torch.Tensor:
        """``score`` of states already encoded (``encode_states``): no torch op on the tensors here,
        so the scorer-client thread never runs a parallel region (``gambit.engine.torch_threads``).
        Sent as calls of at most the Scorer's ``max_rows`` rows (its Info), one after the other: the
        forks ride on the first, the drops on the last, so they apply as for one request."""
        with self._lock:
            forks, drops = self._forks, self._drops
            self._forks, self._drops = [], []
        t0 = time.perf_counter()
        parts: list[torch.Tensor] = []  # the scores of the calls that landed, in row order
        calls = 0
        self._maybe_resolve()
        if time.monotonic() >= self._down_until:  # down: no call at all (a hung replica took 2 x timeout_s)
            if self._info_ok or self._check_info():
                cuts = self._cuts(len(keys))
                calls = len(cuts) - 1
                row, feat = (len(raw) // len(keys), len(features or ()) // len(keys)) if keys else (0, 0)
                for i, (lo, hi) in enumerate(zip(cuts, cuts[1:], strict=False)):
                    req = self.pb2.ScoreRequest(
                        states=raw[lo * row:hi * row], dtype=dtype, shape=[hi - lo, *shape[1:]],
                        trace_ids=keys[lo:hi], drops=drops if i == calls - 1 else [],
                        forks=[self.pb2.Fork(parent=p, child=c) for p, c in (forks if i == 0 else ())],
                        features=(features or [])[lo * feat:hi * feat])
                    scores = self._send(req, hi - lo)
                    if scores is None:  # the rest falls back: no call during the back-off
                        break
                    parts.append(scores)
            if len(parts) < calls or not calls:  # back off: retry_after_s, doubled per failure in a row
                # the exponent bounded: 2 ** 1024 is no float (OverflowError), ~8 h into an outage
                wait = min(self.retry_after_s * 2 ** min(self._failures, MAX_DOUBLINGS), MAX_RETRY_AFTER_S)
                self._failures += 1
                self._info_ok = False  # a Scorer back up may be another one: its Info is asked again
                log.warning("scorer call failed (%s): falling back for %.0f s", self.last_error, wait)
                self._down_until = time.monotonic() + wait
            else:
                self._failures = 0
        dt = time.perf_counter() - t0
        self.sync_seconds += dt
        self.calls += 1
        landed = sum(len(s) for s in parts)
        whole = calls > 0 and len(parts) == calls
        if not whole:  # forks went with the first call, drops with the last: the others go with the next
            self._requeue([] if parts else forks, drops)
            self.fallbacks += 1
            if self.metrics is not None:
                self.metrics.inc("gambit_scorer_fallback_total")
        elif self.metrics is not None:  # the Scorer records its own latency and batch: counted once there
            self.metrics.observe("gambit_guidance_sync_seconds", dt)
        got = [x for part in parts for x in part.tolist()]
        with self._lock:
            for k, s in zip(keys[:landed], got, strict=True):
                if k in self._dropped:
                    self._late(k, drops if whole else [])
                    continue
                tot, n = self._sum.get(k, (0.0, 0))
                self._sum[k] = (tot + s, n + 1)
            got += [self._mean(k) for k in keys[landed:]]
        if len(parts) == 1 and len(got) == landed:  # one call: its tensor, as it came
            return parts[0]
        return torch.from_numpy(np.asarray(got, dtype=np.float32))  # numpy: no ATen work (torch.cat)

    def _cuts(self, n: int) -> list[int]:
        """Where ``n`` rows split into calls of at most the Scorer's ``max_rows`` (0: not said, one call):
        a merged call over it was refused, and its rows scored the fallback."""
        step = self.max_rows or max(n, 1)
        return list(range(0, n, step)) + [n] if n else [0, 0]

    def _send(self, req, n: int) -> torch.Tensor | None:
        """One Score call at the direct endpoint, else the proxy; None when neither answers it."""
        if direct := self.direct:
            scores = self._call(self._stub(direct)[1], req, n)
            if scores is not None:
                self.direct_calls += 1
                return scores
            if self.last_error.startswith("INVALID_ARGUMENT"):  # the same ScorerCore refuses it there
                return None
            self._direct_gone(direct)  # the replica went away: the proxy routes to a live one
        return self._call(self.stub, req, n)

    def _late(self, key: str, sent: list[str]) -> None:
        """A score of a trace dropped before it came back (the driver drops a trace that ends in the step
        of its last boundary, before that boundary's call): its running mean is not kept again (one per
        ended trace, never dropped, grew the client without end), and where its drop left in an earlier
        call than the row, the Scorer's history it re-created is dropped again. Under the lock."""
        if key not in sent and key not in self._drops:
            self._drops.append(key)

    def _requeue(self, forks: list[tuple[str, str]], drops: list[str]) -> None:
        """Put a failed call's forks and drops back, before any queued since, for the next call."""
        with self._lock:
            self._forks, self._drops = forks + self._forks, drops + self._drops
            over = len(self._forks) + len(self._drops) - MAX_PENDING
            if over > 0:
                log.warning("scorer down: %d queued forks/drops discarded (the oldest)", over)
                cut = min(over, len(self._drops))
                self._drops = self._drops[cut:]
                self._forks = self._forks[over - cut:]

    def _check_info(self) -> bool:
        """Whether the Scorer reads the rows this Target sends (its Info's hidden size and features), asked
        at the direct endpoint, else the proxy. False, with ``last_error`` set, when neither answers or
        it reads other rows; then ``unguided`` says why, logged as an ERROR once per reason."""
        sent = FEATURES if self.confidence else 0
        for address in dict.fromkeys(a for a in (self.direct, self.address) if a):
            try:
                info = self._stub(address)[1].Info(self.pb2.InfoRequest(), timeout=self.timeout_s,
                                                   metadata=self.metadata)
            except (grpc.RpcError, ValueError) as e:  # ValueError: its channel was closed (evicted)
                self.last_error = (f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError)
                                   else str(e))
                if address != self.address:  # the replica went away: the proxy routes to a live one
                    self._direct_gone(address)
                continue
            if (info.hidden_size, info.features) == (self.hidden_size, sent):
                self._info_ok, self.unguided, self.max_rows = True, "", info.max_rows
                return True
            why = (f"runs unguided: the Scorer at {address} reads hidden states of width {info.hidden_size} "
                   f"with {info.features} confidence features per row, this Target sends width "
                   f"{self.hidden_size} (its model's hidden size) with {sent}: it refuses every Score call, "
                   "so each trace scores its running mean (0.5); serve a scorer of this model's width "
                   "(gambit scorer serve --model M) and name the same --scorer on both sides")
            if why != self.unguided:
                log.error("%s", why)
            self.unguided = self.last_error = why
            return False
        return False

    def _call(self, stub, req, n: int) -> torch.Tensor | None:
        try:
            resp = stub.Score(req, timeout=self.timeout_s, metadata=self.metadata)
            scores = torch.from_numpy(np.asarray(resp.scores, dtype=np.float32))  # numpy: no ATen work
            if scores.shape[0] != n:
                raise ValueError(f"scorer returned {scores.shape[0]} scores for {n} rows")
            return scores
        except (grpc.RpcError, ValueError) as e:
            # the code and the server's reason: a refused call (a wrong width) is not an unreachable one
            self.last_error = (f"{e.code().name}: {e.details()}" if isinstance(e, grpc.RpcError)
                               else str(e))
            return None

    def score_async(self, keys: Sequence[Hashable], states: torch.Tensor) -> Future:
        """A future of ``score`` while the engine keeps decoding. Calls leave one at a time, in order
        (a sequence scorer sees each trace's boundaries in order); whatever queued up while one
        was in flight leaves as one request, so a slow scorer gets fewer, larger calls."""
        fut: Future = Future()
        keys = [str(k) for k in keys]
        try:  # encoded here, on the caller's (the engine's) thread: see ``_score_raw``
            sent, enc, feats, bad = self._encode(keys, states)
        except ValueError as e:
            fut.set_exception(e)
            return fut
        with self._lock:
            if self._closed:  # its sender has ended: queued, the future was never answered (a hang)
                fut.set_exception(RuntimeError("scorer client is closed"))
                return fut
            self._queue.append((keys, sent, enc, feats, bad, fut))
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_loop, name="scorer-client", daemon=True)
                self._sender.start()
            self._wake.notify()
        return fut

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                jobs, self._queue = self._queue, []
            try:
                encs = [enc for _, _, enc, _, _, _ in jobs]  # each [n, hidden_size] (``_encode``)
                dtype = encs[0][1]
                if any(d != dtype for _, d, _ in encs):  # callers' rows of several dtypes: all as float32
                    encs, dtype = [(as_float32(r, d), "float32", sh) for r, d, sh in encs], "float32"
                sent = [k for _, ks, _, _, _, _ in jobs for k in ks]
                # the rows one after the other: the bytes of their concatenation along dim 0
                out = self._score_raw(sent, b"".join(r for r, _, _ in encs), dtype,
                                      [len(sent), self.hidden_size], [x for *_, f, _, _ in jobs for x in f])
            except Exception as e:  # noqa: BLE001 — hand the error to every waiting caller
                for *_, f in jobs:
                    f.set_exception(e)
                continue
            i = 0
            for keys, ks, _, _, bad, f in jobs:
                f.set_result(self._with_bad(keys, bad, out[i:i + len(ks)]))
                i += len(ks)

    def _mean(self, key: str) -> float:
        tot, n = self._sum.get(key, (0.0, 0))
        return tot / n if n else 0.5

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._sender is not None:
            self._sender.join(timeout=5)
        self.close_channels()

