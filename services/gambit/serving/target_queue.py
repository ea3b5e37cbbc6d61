"""What other threads ask of a Target's engine thread, handed over between two steps: runs to admit,
runs to stop, torch work to run (``call``). The engine thread takes each queue under ``_inbox_lock``
and answers it under ``_cv`` (``_admit``), so no caller waits on a lock the engine holds through a step.

Admission reads the runs' cancel flags once more (a run flagged while it waited, in Serve's queue or a
takeover, is refused: ``CancelFlagged``), refuses a run id running here, and checks the KV
(``kv_admission``). A replica whose engine is stuck refuses at once (``EngineStuck``), and a closed one
too (``CLOSED``). ``TargetService`` is the rest: its state, the loop, the deliveries, close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from gambit.serving.kv_admission import check_fits
from gambit.serving.prompt_format import check_special_text
from gambit.serving.run_record import lost_why
from gambit.serving.solve_config import SolveConfig
from gambit.serving.tree_view import StoreUnavailable

log = logging.getLogger("gambit.serving.target_service")  # its messages were the service's: same logger

FLAGS_RETRY_S = 5.0  # after Redis failed to answer at admission, runs are admitted unread this long
CLOSED = "the target's engine thread has stopped (closed)"
CANCEL_CHECK_S = 0.5  # a cancel waiting for the engine thread looks this often whether it died or wedged


class CancelFlagged(RuntimeError):
    """The run's cancel flag was set before admission (its message: the flag's reason)."""


class EngineStuck(RuntimeError):
    """The engine thread has run one piece of work past ``run_lease.STUCK_S`` (its heartbeat is withheld):
    a run is refused before admission, so that another replica takes it (retryable: UNAVAILABLE)."""


class RunQueue:
    """``TargetService``'s hand-over to its engine thread (a mixin: the state is the service's)."""

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
        queued and not waited for (True: the run is here); once its thread died, it is done here."""
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
        while True:  # not for ever: the engine thread may wedge, or die, before it reads the queue
            try:
                return fut.result(timeout=CANCEL_CHECK_S)
            except TimeoutError:
                if not self._thread.is_alive():  # it died: nothing reads the queue now (``_cv`` is free)
                    return self._cancel_now(run_id, status, message)
                if not self.progress.moving():  # wedged after this was queued: done if it moves again
                    return run_id in self._sinks

    def cancel_soon(self, run_id: str, status: str = "cancelled", message: str = "") -> None:
        """``cancel`` that never waits for a step: the engine thread stops the run between two steps (at
        once when called from it, or once it died). For an event loop (a stream its client left)."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            self._cancel_now(run_id, status, message)
        else:
            self._cancel_soon(run_id, status, message)

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
        """Another replica holds the run now, or its record ended elsewhere (``record_writer``): stop it
        here and free its KV."""
        self._cancel_soon(run_id, "cancelled", lost_why(holder, self.replica))

    def _cancel_now(self, run_id: str, status: str, message: str) -> bool:
        with self._cv:
            if run_id not in self._sinks:
                return False
            res = self.driver.cancel(run_id, status, message)
            self._counters()  # its tokens are counted before its result goes out
            self._deliver([res] if res else [])
            return True

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
