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
Its parts: ``kv_admission`` (the KV check), ``run_delivery`` (records, then sinks), ``target_heartbeat``
(the beat and the cancel poll), ``target_metrics``, ``pool_watch``; their public names import from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from gambit.search import batch_slots as slot_rule
from gambit.serving.driver_adapter import DriverAdapter
from gambit.serving.kv_admission import Overcommitted, check_fits  # noqa: F401 (Overcommitted: re-exported)
from gambit.serving.kv_admission import blocks_needed as kv_blocks_needed
from gambit.serving.pool_watch import (  # noqa: F401 (SWITCH_*: re-exported)
    SWITCH_CHECK,
    SWITCH_PERIOD,
    SWITCH_WARN_PER_STEP,
    PoolWatch,
)
from gambit.serving.prompt_format import check_special_text
from gambit.serving.record_writer import InlineRecords, RecordWriter
from gambit.serving.run_delivery import RunDelivery
from gambit.serving.run_lease import Progress
from gambit.serving.solve_config import SolveConfig
from gambit.serving.target_heartbeat import Heartbeat
from gambit.serving.target_metrics import SPEC_BY_DECODING, TargetMetrics  # noqa: F401 (re-exported)
from gambit.serving.tree_view import StoreUnavailable

log = logging.getLogger(__name__)


GAUGE_REFRESH_S = 5.0  # idle replicas re-set their gauges this often, so dashboards never go blank
# While decoding, gauges and token counters are exported at most this often, and whenever a run ends
# (so a run's tokens are counted before its result is sent). Every step, they cost ~0.2 ms of the
# engine thread under Ray's metrics API: ~2% of a one-run step on 2 cores, on the critical path.
METRICS_EVERY_S = 0.25
FLAGS_RETRY_S = 5.0  # after Redis failed to answer at admission, runs are admitted unread this long
# close() waits this long in all for the engine thread (its step under way) and then for its lock; past it,
# the runs here are left to the lease (taken over): a wedged step held the lock, and close() waited for ever
CLOSE_WAIT_S = 10.0

CLOSED = "the target's engine thread has stopped (closed)"


class CancelFlagged(RuntimeError):
    """The run's cancel flag was set before admission (its message: the flag's reason)."""


class EngineStuck(RuntimeError):
    """The engine thread has run one piece of work past ``run_lease.STUCK_S`` (its heartbeat is withheld):
    a run is refused before admission, so that another replica takes it (retryable: UNAVAILABLE)."""


class TargetService:
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

    def submit_run(self, run_id: str, problem: str, cfg: SolveConfig, sink: Callable,
                   resume: bool = False) -> Future:
        """Queue a run; the engine thread admits it before its next step. The future ends with None
        (``resume``: True when the run's tree was restored from the store, False when none was recorded
        and it started afresh), or ValueError (bad input), Overcommitted, NotImplementedError,
        CancelFlagged (its cancel flag was set before admission: never stepped), EngineStuck (this
        replica's engine is wedged in one step: at once, or while it waits for admission). A problem holding a
        special token's text is a ValueError here unless ``raw_prompt`` (``check_special_text``). It never
        waits for a step to end, so an event loop can await it while the engine decodes."""
        fut: Future = Future()
        if not cfg.raw_prompt:  # a request error on the future: INVALID_ARGUMENT, never a failed stream
            try:
                check_special_text(problem, self.engine.tokenizer)
                if self.format_problem is not None:
                    problem = self.format_problem(problem)
            except ValueError as e:
                fut.set_exception(e)
                return fut
        with self._inbox_lock:  # under the lock: close() answers what got in before it set _stop
            if self._stop or not self._thread.is_alive():  # nothing would admit it: its caller waited forever
                fut.set_exception(RuntimeError(CLOSED))
                return fut
            if (stuck_s := self.progress.stuck_for()) > self.progress.stuck_s:  # (``Progress.moving``)
                fut.set_exception(self._stuck(stuck_s))  # it would wait behind a step that may never end
                return fut
            self._inbox.append((run_id, problem, cfg, sink, fut, resume))
        if self._idle:
            with self._cv:
                self._cv.notify()
        return fut

    def start_run(self, run_id: str, problem: str, cfg: SolveConfig, sink: Callable) -> None:
        """``submit_run`` and wait for the admission."""
        self.submit_run(run_id, problem, cfg, sink).result()

    def cancel(self, run_id: str, status: str = "cancelled", message: str = "") -> bool:
        """Stop a run and free its KV; its sink gets the result. False if it is not here. From another
        thread the engine thread does it between two steps (a lock taken here would wait for the run
        to end: the engine thread takes it again right after each step). While the engine is stuck it is
        queued and not waited for (True: the run is here)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            return self._cancel_now(run_id, status, message)
        if not self.progress.moving():  # a wedged step: the wait never ended (a Serve thread per CancelRun)
            here = run_id in self._sinks
            self._cancel_soon(run_id, status, message)  # done if the engine ever moves again
            return here
        fut: Future = Future()
        with self._inbox_lock:
            closing = self._stop  # close() may have answered the queue already: stop it here, under _cv
            if not closing:
                self._cancels.append((run_id, status, message, fut))
        if closing:
            return self._cancel_now(run_id, status, message)
        if self._idle:
            with self._cv:
                self._cv.notify()
        return fut.result()

    def cancel_soon(self, run_id: str, status: str = "cancelled", message: str = "") -> None:
        """``cancel`` that never waits for a step: the engine thread stops the run between two steps (at
        once when called from it, or once it died). For an event loop (a stream its client left)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            self._cancel_now(run_id, status, message)
        else:
            self._cancel_soon(run_id, status, message)

    def health(self) -> str:
        """Why this replica cannot serve ("" when it can): its engine thread died, or it is stuck in one
        piece of work past ``progress.stuck_s`` (``run_lease.STUCK_S``, far above any legit step). Cheap
        and lock-free (``Progress`` only), so a health check on an event loop never waits for a step."""
        if not self._thread.is_alive():
            return f"Target replica {self.replica}: {CLOSED}"
        if (stuck_s := self.progress.stuck_for()) > self.progress.stuck_s:
            return str(self._stuck(stuck_s))
        return ""

    def call(self, fn: Callable[[], object]) -> Future:
        """Run ``fn()`` on the engine thread between two steps; the future ends with its result.
        Torch work of this process belongs there (``gambit.engine.torch_threads``): a second thread
        running parallel regions would make every step's OpenMP workers sleep and wake."""
        fut: Future = Future()
        with self._inbox_lock:
            if self._stop or not self._thread.is_alive():
                fut.set_exception(RuntimeError(CLOSED))
                return fut
            self._calls.append((fn, fut))
        if self._idle:
            with self._cv:
                self._cv.notify()
        return fut

    def _cancel_soon(self, run_id: str, status: str, message: str) -> None:
        """``cancel`` that does not wait for the step under way: the heartbeat's thread waited in
        ``cancel`` for a flagged run, so a long step (a big prefill: legit up to ``run_lease.STUCK_S``)
        withheld the beat, and the lease of every run here could lapse (taken over, its work redone)."""
        with self._inbox_lock:
            if self._stop or run_id in self._stopping:
                return
            self._stopping.add(run_id)
            self._cancels.append((run_id, status, message, Future()))
        if self._idle:
            with self._cv:
                self._cv.notify()

    def _stuck(self, stuck_s: float | None = None) -> EngineStuck:
        stuck_s = self.progress.stuck_for() if stuck_s is None else stuck_s
        return EngineStuck(f"Target replica {self.replica}: its engine has run one step for "
                           f"{stuck_s:.1f} s (over {self.progress.stuck_s:g} s: wedged, "
                           "its heartbeat withheld); it takes no run now: retry, another replica takes it")

    def _refuse_queued(self) -> int:
        """While the engine is stuck, or once its thread died (the heartbeat's thread): the runs waiting for
        admission are refused (``EngineStuck``; ``CLOSED``); they never started, and no lease covered them.
        Returns how many."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        for *_, fut, _resume in inbox:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(self._stuck() if self._thread.is_alive() else RuntimeError(CLOSED))
        return len(inbox)

    def _taken_over(self, run_id: str, holder: str) -> None:
        """Another replica holds the run now (``record_writer``): stop it here and free its KV."""
        self._cancel_soon(run_id, "cancelled", f"taken over by Target replica {holder} (this replica "
                                               f"{self.replica} lost its lease)")

    @property
    def engine_thread_id(self) -> int | None:
        """Native id of the engine thread (its OS thread, for CPU and context-switch accounting)."""
        return self._thread.native_id

    def _cancel_now(self, run_id: str, status: str, message: str) -> bool:
        with self._cv:
            if run_id not in self._sinks:
                return False
            res = self.driver.cancel(run_id, status, message)
            self._counters()  # its tokens are counted before its result goes out
            self._deliver([res] if res else [])
            return True

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
    def _admit(self) -> None:
        """Admit the queued runs (under ``_cv``): reserve their worst-case KV and submit them."""
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
            self._stopping.clear()
            calls, self._calls = self._calls, []
        flags = self._flags([r[0] for r in inbox]) if inbox else {}
        for fn, fut in calls:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except Exception as e:  # noqa: BLE001 — the caller gets it
                    fut.set_exception(e)
        for run_id, status, message, fut in cancels:
            fut.set_result(self._cancel_now(run_id, status, message))
        for run_id, problem, cfg, sink, fut, resume in inbox:
            if not fut.set_running_or_notify_cancel():  # given up on before admission
                continue
            if run_id in flags:  # cancelled while it waited: no engine step is spent on it
                fut.set_exception(CancelFlagged(flags[run_id]))
                continue
            try:
                if run_id in self._sinks:  # before the KV check: "retry later" never frees this id
                    raise ValueError(f"run_id: {run_id!r} is already running on replica {self.replica}")
                need = self.blocks_needed(problem, cfg)
                free = self.engine.num_blocks - sum(self._reserved.values())
                check_fits(self.engine, cfg, need, free, self.replica)
                restored = self.driver.resume(run_id, problem, cfg) if resume else None
                if not resume:
                    self.driver.submit(run_id, problem, cfg)
            except Exception as e:  # noqa: BLE001 — the caller gets it
                fut.set_exception(e)
                continue
            self._sinks[run_id] = sink
            self._reserved[run_id] = need
            self.delivery.admitted(run_id, cfg)
            # GetRun says running, on which replica, from admission (it said queued until the first
            # round's progress: a whole run with a long round interval); queued while the driver holds
            # it for batch slots (``SearchDriver._fits``), until its first round's progress
            held = run_id in self.driver.driver.held
            self.records.put_run(run_id, status="queued" if held else "running", replica=self.replica)
            fut.set_result(restored)
        if inbox:
            self._gauges()

    def _flags(self, run_ids: list[str]) -> dict[str, str]:
        """The cancel flags of the runs about to be admitted, in one read: a flag set at any time before
        admission refuses the run (read earlier, one set meanwhile was seen only by the poll, after a
        step). Redis not answering: none for ``FLAGS_RETRY_S`` (the poll stops a flagged run once in),
        so an outage does not hold every admission, and the engine, for a socket timeout."""
        if self.tree is None or time.monotonic() < self._flags_at:
            return {}
        try:
            return self.tree.cancel_requested(run_ids)
        except StoreUnavailable as e:
            self._flags_at = time.monotonic() + FLAGS_RETRY_S
            log.warning("cancel flags not read at admission for %.0f s: %s", FLAGS_RETRY_S, e)
            return {}

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
