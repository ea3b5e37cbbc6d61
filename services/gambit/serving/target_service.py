"""One engine serving many concurrent runs: the part the embedded wiring and the Ray ``Target``
deployment share.

A background thread steps the search driver while any run is in flight; each run's progress and
result records go to that run's sink (a queue). Each run keeps its own capacity C; their traces
share the engine's batch and KV. A run whose worst-case KV (C traces × (prompt + max_tokens))
does not fit beside the runs already admitted is refused (``Overcommitted`` → RESOURCE_EXHAUSTED).
A Gambit run whose C does not fit in the batch slots the admitted runs leave is admitted but held by
the driver (its record says queued) until it does (``SearchDriver._fits``).
A replica whose engine is stuck in one step (``run_lease.STUCK_S``: its heartbeat is withheld) refuses new
runs at once (``EngineStuck`` → UNAVAILABLE: the Coordinator tries another replica), and those waiting for
admission too (``target_heartbeat``): queued behind the stuck step, they never started and nothing ended them.
Cancel flags in the tree view are polled, so a CancelRun that reaches any coordinator stops the
run on the replica that holds it; they are read again at admission, so a run flagged while it waited
(Serve's queue, a takeover) is refused (``CancelFlagged``) before any engine step.
A replica that finds a run it holds taken over by another (a refused conditional write, ``record_writer``;
or a read of its runs' records once it beats again after its beat was withheld or failed) stops it and
frees its KV, and writes nothing more of it: it wrote its progress and result over the takeover's record.
Its parts: ``target_queue`` (admissions, cancels and calls handed to the engine thread), ``kv_admission``
(the KV check), ``run_delivery`` (records, then sinks), ``target_heartbeat`` (the beat and the cancel poll),
``target_metrics``, ``pool_watch``; their public names import from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gambit.search import batch_slots as slot_rule
from gambit.serving.driver_adapter import DriverAdapter
from gambit.serving.kv_admission import Overcommitted  # noqa: F401 (re-exported)
from gambit.serving.kv_admission import blocks_needed as kv_blocks_needed
from gambit.serving.pool_watch import (  # noqa: F401 (SWITCH_*: re-exported)
    SWITCH_CHECK,
    SWITCH_PERIOD,
    SWITCH_WARN_PER_STEP,
    PoolWatch,
)
from gambit.serving.record_writer import InlineRecords, RecordWriter
from gambit.serving.run_delivery import RunDelivery
from gambit.serving.run_lease import Progress
from gambit.serving.solve_config import SolveConfig
from gambit.serving.target_heartbeat import Heartbeat
from gambit.serving.target_metrics import SPEC_BY_DECODING, TargetMetrics  # noqa: F401 (re-exported)
from gambit.serving.target_queue import (  # noqa: F401 (re-exported: their importers read them here)
    CLOSED,
    FLAGS_RETRY_S,
    CancelFlagged,
    EngineStuck,
    RunQueue,
)

log = logging.getLogger(__name__)


GAUGE_REFRESH_S = 5.0  # idle replicas re-set their gauges this often, so dashboards never go blank
# While decoding, gauges and token counters are exported at most this often, and whenever a run ends
# (so a run's tokens are counted before its result is sent). Every step, they cost ~0.2 ms of the
# engine thread under Ray's metrics API: ~2% of a one-run step on 2 cores, on the critical path.
METRICS_EVERY_S = 0.25
# close() waits this long in all for the engine thread (its step under way) and then for its lock; past it,
# the runs here are left to the lease (taken over): a wedged step held the lock, and close() waited for ever
CLOSE_WAIT_S = 10.0


class TargetService(RunQueue):
    def __init__(self, engine, scorer=None, tree=None, metrics=None, replica: str = "local",
                 cancel_poll_s: float = 0.1, store=None, async_records: bool = False,
                 format_problem: Callable[[str], str] | None = None) -> None:
        """``tree``: run records and cancel flags (``tree_view``); ``store``: the driver's TreeStore;
        ``async_records``: write both from a writer thread (Redis), not inline (memory);
        ``format_problem``: a problem -> the model's prompt (``prompt_format``; None: as it is)."""
        self.format_problem = format_problem
        self.engine, self.tree, self.metrics, self.replica = engine, tree, metrics, replica
        self.scorer = scorer
        writer = RecordWriter if async_records else InlineRecords
        self.records = writer(store, tree, on_lost=self._taken_over)
        self.driver = DriverAdapter(engine, scorer, store, metrics, writes=self.records)
        self.cancel_poll_s = cancel_poll_s
        self._sinks: dict[str, Callable] = {}
        self._reserved: dict[str, int] = {}
        self._cv = threading.Condition()  # guards the driver; the engine thread holds it while stepping
        # runs to admit at the next step: (run id, problem, cfg, sink, future, resume)
        self._inbox: list[tuple] = []
        self._cancels: list[tuple] = []  # runs to stop at the next step: (run id, status, message, future)
        self._stopping: set[str] = set()  # run ids in _cancels from ``_cancel_soon`` (one each)
        self._calls: list[tuple] = []  # (fn, future): torch work to run on the engine thread (``call``)
        self._inbox_lock = threading.Lock()
        self._idle = False
        self._stop = False
        self.step_seconds = 0.0
        self._steps = 0
        self.delivery = RunDelivery(scorer)  # records, then sinks (``run_delivery``)
        self._metrics_due = 0.0  # monotonic time of the next gauge/counter export while decoding
        self._flags_at = 0.0  # monotonic time from which admission reads cancel flags again
        self.exports = TargetMetrics(engine)  # token counters and gauges (``target_metrics``)
        self._gauges()  # exported from the start (Ray exports a gauge once it was set)
        self.progress = Progress()  # the heartbeat is written while the engine loop moves (``run_lease``)
        self._thread = threading.Thread(target=self._loop, name="target-loop", daemon=True)
        self._pool_watch = PoolWatch(self._thread)  # warns of a second OpenMP pool (``pool_watch``)
        self._thread.start()
        if tree is not None:  # its heartbeat and the runs' cancel flags (``target_heartbeat``)
            threading.Thread(target=Heartbeat(self).run, name="cancel-poll", daemon=True).start()

    # -- API -----------------------------------------------------------------------------------
    def blocks_needed(self, problem: str, cfg: SolveConfig) -> int:
        """KV blocks of C full-length traces, the prompt's full blocks held once (``kv_admission``);
        a ValueError naming ``problem`` when no run can take it."""
        return kv_blocks_needed(self.engine, problem, cfg)

    def load(self) -> dict:
        return {"replica": self.replica, "runs": len(self._sinks),
                "reserved_blocks": sum(self._reserved.values()), "num_blocks": self.engine.num_blocks,
                "block_size": self.engine.blocks.block_size, "max_model_len": self.engine.max_model_len,
                "kv_usage": self.engine.kv_usage(), "scorer_direct": getattr(self.scorer, "direct", ""),
                "scorer_error": getattr(self.scorer, "resolve_error", "")} | self.batch_slots()

    def batch_slots(self) -> dict:
        """The engine batch's slots as the driver counts them (``SearchDriver._fits``: each run holds
        ``batch_slots.slots``): ``max_num_seqs``; ``batch_slots``, those of the launched and held runs (a
        Gambit run launches now only if its own fit beside them: held ones are served first); ``slots_used``,
        the launched runs' alone; ``held``, runs waiting for slots. From any thread: it reads snapshots."""
        driver, seqs = self.driver.driver, int(self.engine.config.max_num_seqs)
        held = set(driver.held)
        runs = list(driver.runs.values())
        slots = [(r.run_id in held, slot_rule.slots(r.cfg.capacity, seqs)) for r in runs]
        return {"max_num_seqs": seqs, "batch_slots": sum(n for _, n in slots),
                "slots_used": sum(n for h, n in slots if not h), "held": sum(h for h, _ in slots)}

    def health(self) -> str:
        """Why this replica cannot serve ("" when it can): its engine thread died, or it is stuck in one
        piece of work past ``progress.stuck_s`` (``run_lease.STUCK_S``, far above any legit step). Cheap
        and lock-free (``Progress`` only), so a health check on an event loop never waits for a step."""
        if not self._thread.is_alive():
            return f"Target replica {self.replica}: {CLOSED}"
        if (stuck_s := self.progress.stuck_for()) > self.progress.stuck_s:
            return str(self._stuck(stuck_s))
        return ""

    @property
    def engine_thread_id(self) -> int | None:
        """Native id of the engine thread (its OS thread, for CPU and context-switch accounting)."""
        return self._thread.native_id

    def close(self) -> None:
        """Stop the engine thread, end the runs here (cancelled), flush their records, close the scorer
        client. Once: a second call returns at once (it waited ``flush``'s 5 s on the closed writer).
        It waits ``CLOSE_WAIT_S`` at most for the step under way: the engine thread holds ``_cv`` through
        a step, so a wedged one hung close() (and Serve's replacement of the replica) for ever; past it,
        the runs here are not ended (the driver is the engine thread's): their lease lapses, others take
        them over."""
        with self._inbox_lock:
            again, self._stop = self._stop, True
        if again:
            return
        deadline = time.monotonic() + CLOSE_WAIT_S
        # it sees _stop before it waits again (read under _cv): a notify is due only if it waits now,
        # and then _cv is free
        if self._cv.acquire(timeout=CLOSE_WAIT_S):
            self._cv.notify_all()
            self._cv.release()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._cv.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                self._admit()
                for rid in list(self._sinks):
                    self._deliver([self.driver.cancel(rid, "cancelled", "target shutting down")])
            finally:
                self._cv.release()
        else:
            log.error("engine step running for %.0f s: closed without ending the %d run(s) here (their "
                      "lease lapses: other replicas take them over)", self.progress.stuck_for(),
                      len(self._sinks))
        self.records.flush()
        self.records.close()
        close = getattr(self.scorer, "close", None)  # a RemoteScorer's sender thread and gRPC channels
        if callable(close):
            try:
                close()
            except Exception:  # noqa: BLE001 — the service is closed all the same
                log.exception("scorer client not closed")

    # -- loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._idle = True
                self.progress.idle()
                while not (self._stop or self.driver.has_work() or self._inbox or self._cancels
                           or self._calls):
                    if not self._cv.wait(timeout=GAUGE_REFRESH_S):
                        self._gauges()  # Ray drops a gauge not set for ~2 export intervals (ops)
                self._idle = False
                self.progress.busy()
                if self._stop:
                    self._admit()  # answers the cancels that are waiting; close() stops the rest
                    return
                self._admit()
                if not self.driver.has_work():
                    continue
                t0 = time.perf_counter()
                try:
                    outs = self.driver.step()
                except Exception as e:  # noqa: BLE001 — fail the runs, keep the replica alive
                    log.exception("driver step failed")
                    outs = [self.driver.cancel(r, "failed", f"target error: {e}") for r in list(self._sinks)]
                self.step_seconds += time.perf_counter() - t0
                self._steps += 1
                self._pool_watch.after_step(self._steps)
                now = time.monotonic()
                ended = any(o is not None and o["kind"] == "result" for o in outs)
                export = ended or now >= self._metrics_due
                if export:
                    self._metrics_due = now + METRICS_EVERY_S
                    self._counters()
                self._deliver(outs, gauges=export)

    def _deliver(self, outs, gauges: bool = True) -> None:
        for o in outs:
            if o is None:
                continue
            sink = self._sinks.get(o["run_id"])
            if o["kind"] == "result":
                self._sinks.pop(o["run_id"], None)
                self._reserved.pop(o["run_id"], None)
                self.delivery.result(o, sink, self.records, self.replica)
            else:
                self.delivery.progress(o, sink, self.records, self.replica)
        if gauges:
            self._gauges()

    def _counters(self) -> None:
        self.exports.counters(self.metrics)

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.exports.gauges(self.metrics, len(self._sinks), self.batch_slots(), self.driver.gauges())
