"""The search driver: many runs over ONE engine and ONE scorer, stepping the engine once per call.

``submit(problem, config) -> run_id``; ``step() -> [Progress | RunResult]`` (one Progress per round
of a run, one RunResult when a run ends); ``cancel(run_id)`` frees its KV; ``recover()`` reloads every
unfinished run from the store after a coordinator restart. Each step: engine forward (scheduler
view), event routing, one batched scorer call for every run's new boundaries (guidance sync), the
runs' rounds (tree view), then the KV-ratio eviction of the lowest-ranked resident trace.

Batch slots (a run held until its pool fits the engine's batch) live in ``batch_slots``, the
KV-ratio eviction's choice in ``kv_evict``; the driver keeps their state (``held``, ``_ratio``). The
admission of runs (the held queue, ``adopt``/``recover``) is ``admission.Admission``, mixed in.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque

from gambit.engine import BoundaryEvent, EvictedEvent, FinishedEvent, TokenEvent
from gambit.search import kv_evict
from gambit.search import tree as T
from gambit.search.admission import Admission
from gambit.search.config import SearchConfig
from gambit.search.guidance import Guidance
from gambit.search.results import Progress, RunResult
from gambit.search.run_state import TIMING_KEYS, SearchRun
from gambit.search.store import MemoryStore, RunUpdate, TreeStore, check_run_id
from gambit.search.tree import Node

log = logging.getLogger(__name__)

# main-thread CPU seconds by part (``SearchDriver.cpu``): what ``gambit bench rounds`` reads. Thread
# CPU time does not grow when another process takes the cores, so it measures the tournament's own
# cost on a shared machine; the forward's share is the main thread's part of it (one of the torch
# threads), which on an idle machine is its wall time.
CPU_KEYS = ("forward", "routing", "guidance", "round", "store", "finish", "kv_evict")
# steps ``SearchDriver.kv_trace`` keeps (the latest): a served driver lives as long as its replica, and an
# unbounded list grew by a tuple every step (~120 B, ~0.5 GB a day at 50 steps/s)
KV_TRACE_STEPS = 4096


def _no_clock() -> float:
    return 0.0


class SearchDriver(Admission, Guidance):
    def __init__(self, engine, scorer=None, store: TreeStore | None = None, cpu_clock: bool = False) -> None:
        """``cpu_clock``: count main-thread CPU by part in ``cpu`` (``gambit bench rounds``). Off, the
        parts stay 0: a thread-CPU clock read is a system call (~0.9 µs here) and a step makes eleven."""
        self.engine, self.scorer = engine, scorer
        self.store = store if store is not None else MemoryStore()
        self.lazy = bool(getattr(self.store, "lazy_nodes", False))  # writes carry node snapshots
        self.runs: dict[str, SearchRun] = {}
        self.owner: dict[int, tuple[SearchRun, int, Node]] = {}  # engine trace id -> (run, node id, node)
        self.timings = dict.fromkeys(TIMING_KEYS, 0.0)
        # (time, KV use, resident traces) per step, the latest KV_TRACE_STEPS
        self.kv_trace: deque[tuple[float, float, int]] = deque(maxlen=KV_TRACE_STEPS)
        self.pending: list[tuple[list, object]] = []  # (who, future of scores) from ``score_async``
        self.cpu = dict.fromkeys(CPU_KEYS, 0.0)
        self._clock = time.thread_time if cpu_clock else _no_clock
        self.score_calls = 0  # scorer calls made (guidance syncs)
        self.deferred: list[tuple] = []  # Gambit boundaries waiting for the next round's scorer call
        self.defers = scorer is not None  # Gambit's boundaries wait for its rounds (``Guidance._defer``)
        self.rounds = self.steps = 0
        self._ratio: float | None = None  # the lowest KV ratio r of the scored runs (``_evict_ratio``)
        self._mode: tuple[bool, bool | str] | None = None  # what the runs read of a step (``_events_mode``)
        # runs submitted or adopted but not launched (in ``runs`` too, so cancel and has_work see them):
        # waiting for batch slots, in submission order (``_admit``)
        self.held: dict[str, SearchRun] = {}
        self._restored: set[str] = set()  # held runs rebuilt from the store: launched by ``_relaunch``
        # results of runs that ended in a step that then raised: ``step`` returns them first next time
        # (they had left ``runs``, so a caller that fails the runs it knows of never saw them end)
        self._carried: list[RunResult] = []

    # -- API ------------------------------------------------------------------------------------
    def submit(self, problem, config: SearchConfig | dict | None = None, run_id: str | None = None) -> str:
        """Start a run, or hold it until its pool fits the engine's batch (``_fits``). ``problem``:
        prompt text, or an object with ``.prompt`` (and ``.answer``)."""
        cfg = SearchConfig(**config) if isinstance(config, dict) else (config or SearchConfig())
        if not isinstance(cfg, SearchConfig):
            raise ValueError("config must be a SearchConfig or a dict of its fields")
        if isinstance(problem, str):
            prompt, gold = problem, None
        elif hasattr(problem, "prompt"):
            prompt, gold = problem.prompt, getattr(problem, "answer", None)
            gold = None if gold is None else str(gold)
        else:
            raise ValueError("problem must be a prompt string or have a .prompt")
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("problem prompt is empty")
        self._check_batch(cfg)  # it would never fit, even alone
        run_id = check_run_id(run_id or uuid.uuid4().hex[:12])
        if run_id in self.runs:
            raise ValueError(f"run {run_id} already exists")
        ids = self.engine.tokenizer.encode_checked(prompt, "problem")
        if len(ids) >= self.engine.max_model_len:  # the engine's rule: room for one generated token
            raise ValueError(f"prompt has {len(ids)} tokens; the context holds {self.engine.max_model_len} "
                             "including at least one generated token")
        run = SearchRun(run_id, cfg, prompt, ids, gold, self.engine, self.scorer, self.owner)
        self._enqueue(run)
        return run_id

    def cancel(self, run_id: str) -> RunResult:
        run = self.runs.get(run_id)
        if run is None:
            raise ValueError(f"no running run {run_id!r}")
        self._unhold(run_id)  # never launched: it ends with no traces (or its stored ones)
        run.stop_all(T.STOPPED, "cancelled")
        return self._finish(run, "cancelled")

    def has_work(self) -> bool:
        return bool(self.runs or self._carried)

    def run_until_done(self, run_ids=None, on_event=None) -> dict[str, RunResult]:
        """Step until the given runs (default: all) end; ``on_event`` sees every Progress/Result."""
        want = set(self.runs) if run_ids is None else set(run_ids)
        done: dict[str, RunResult] = {}
        while want - set(done):
            for ev in self.step():
                if on_event is not None:
                    on_event(ev)
                if isinstance(ev, RunResult) and ev.run_id in want:
                    done[ev.run_id] = ev
        return done

    # -- one iteration --------------------------------------------------------------------------
    def step(self) -> list[Progress | RunResult]:
        """One engine step for every launched run. A run whose own part raises (its round, vote or
        store write) ends alone as "failed" (``_fail``); an error of the shared part (the engine, the
        scorer) propagates, and the results of runs that ended before it come with the next step."""
        out: list[Progress | RunResult] = self._carried
        self._carried = []
        try:
            self._step(out)
        except Exception:
            self._carried = [ev for ev in out if isinstance(ev, RunResult)]
            raise
        return out

    def _step(self, out: list[Progress | RunResult]) -> None:
        if not self.runs:
            return
        if self.held:
            out.extend(self._expire_held())  # before they may launch: a run out of time ends unlaunched
            self._admit()
        runs = self._launched()
        if not runs:
            return
        cpu, clock = self.cpu, self._clock
        c0 = clock()
        t0 = time.perf_counter()
        for run in runs:
            if run.cfg.max_total_tokens:
                run.fit_budget()  # the last steps before its budget: token caps, so it ends there exactly
        drafts = self.engine.stats.spec_drafts
        per_token, token_events = self._events_mode(runs)
        events = self.engine.step(token_events=token_events)
        t1 = time.perf_counter()
        c1 = clock()
        cpu["forward"] += c1 - c0
        self.steps += 1
        if self.deferred and self.engine.kv_usage() > self._evict_ratio():
            self._score_now(self._take_deferred())  # a trace may be evicted: it ranks on its scores
        t1b, c1b = time.perf_counter(), clock()  # that call is guidance, not routing
        gw = gc = 0.0  # guidance inside the loop: a trace ends, the deferred scores go first
        rows: list[tuple] = []  # (key, state, features, run, node) per boundary to score
        owner_get = self.owner.get
        # speculative runs' Δ clocks count tokens (``tick``); a step that verified no tree emitted one a trace
        drafted = self.engine.stats.spec_drafts != drafts
        spec = [r for r in runs if r.cfg.decoding != "plain"] if drafted else []
        emitted: dict[SearchRun, list] = {}  # speculative runs: [tokens this step, the traces that took them]
        for ev in events:
            if type(ev) is TokenEvent:  # most events: nothing to do unless a window reads them
                if per_token or spec:
                    o = owner_get(ev.trace_id)
                    if o is not None and o[0].per_token:
                        o[0].on_token(o[2], ev)
                    if o is not None and o[0].cfg.decoding != "plain":
                        e = emitted.setdefault(o[0], [0, set()])
                        e[0] += 1
                        e[1].add(ev.trace_id)
                continue
            o = owner_get(ev.trace_id)
            if o is None:
                continue
            run, nid, node = o
            if type(ev) is BoundaryEvent:
                run.sync(node, ev.position + 1)  # its tokens up to this one (depth, confidence)
                f = run.boundary_features(node, ev.position)
                if run.wants_score(node):
                    rows.append((run.key(nid), ev.hidden, f, run, node))
            elif type(ev) is FinishedEvent:
                if self.deferred:
                    gw, gc = self._score_deferred(gw, gc)
                run.on_finished(node, ev.reason)
            elif type(ev) is EvictedEvent:
                if self.deferred:
                    gw, gc = self._score_deferred(gw, gc)
                run.evict(node)
        for run in runs:  # Δ clock: the mean tokens its traces that emitted took (plain or capped: 1)
            e = emitted.get(run)
            run.tick = max(1.0, e[0] / len(e[1])) if e else 1.0
        t2 = time.perf_counter()
        c2 = clock()
        t1b, c1b = t1b + gw, c1b + gc  # the deferred call's time counts as guidance, not routing
        cpu["routing"] += c2 - c1b
        if self.defers and (rows or self.deferred):
            rows = self._defer(rows, runs)
        who = [(r[3], r[4]) for r in rows]
        self._score(rows)
        if self.pending:  # rounds and votes rank on every boundary of their run scored so far
            due = {r.run_id for r in runs if r.round_this_step() or r.is_done()}
            if due:
                self._settle(due)
        t3 = time.perf_counter()
        self._account(runs, t1 - t0, t2 - t1b, t3 - t2 + t1b - t1, who)
        c3 = clock()
        cpu["guidance"] += c3 - c2 + c1b - c1
        usage = self.engine.kv_usage()
        writes: list[tuple[str, RunUpdate]] = []  # this step's rounds, written at once
        for run in runs:
            try:
                self._run_step(run, usage, out, writes)
            except Exception as e:  # noqa: BLE001 — this run fails alone, the others go on
                out.append(self._fail(run, e))
        if writes:
            out.extend(self._write(writes))
        t4 = time.perf_counter()
        c4 = clock()
        self._kv_evict()
        t5 = time.perf_counter()
        c5 = clock()
        cpu["kv_evict"] += c5 - c4
        for run in runs:
            run.timings["scheduling"] += (t5 - t4) / len(runs)
        self.timings["tree"] += t4 - t3
        self.timings["scheduling"] += t5 - t4
        self.kv_trace.append((t5, self.engine.kv_usage(), len(self.owner)))

    def _run_step(self, run: SearchRun, usage: float, out: list, writes: list) -> None:
        """One run's part of a step after the scorer call: its limits, its end or its round."""
        cpu, clock = self.cpu, self._clock
        round_due = run.count_step()
        if run.over_limit():
            run.stop_all(T.STOPPED, "limit")
            out.append(self._finish(run, "limit"))
            return
        run.maybe_next_phase()
        if run.decided():
            run.stop_all(T.STOPPED, "decided")
            out.append(self._finish(run, "decided"))
            return
        if run.is_done():
            out.append(self._finish(run, "done"))
            return
        if round_due:
            c = clock()
            out.append(run.do_round(usage))
            t, c4 = time.perf_counter(), clock()
            writes.append((run.run_id, run.flush(self.lazy)))
            run.timings["tree"] += time.perf_counter() - t
            cpu["round"] += c4 - c
            cpu["store"] += clock() - c4
            self.rounds += 1

    def _score_deferred(self, wall: float, cpu: float) -> tuple[float, float]:
        """Score the deferred boundaries before the first trace that ends this step is routed (so
        its vote and scorer history are as if scored at once; nothing routed before it reads
        scores); returns ``wall``, ``cpu`` plus the time it took."""
        t, c = time.perf_counter(), self._clock()
        self._score(self._take_deferred())
        return wall + time.perf_counter() - t, cpu + self._clock() - c

    def _write(self, writes: list[tuple[str, RunUpdate]]) -> list[RunResult]:
        """A step's round updates in one store call (Redis: one MULTI/EXEC, one round trip); each
        run's update stays whole, so a reader still sees whole rounds only. If that call fails (it
        wrote none of them), each is written alone, and a run whose write fails ends as "failed"
        (returned): one bad update lost every run's results of the step."""
        t, c = time.perf_counter(), self._clock()
        many = getattr(self.store, "update_many", None)
        failed: list[RunResult] = []
        alone = writes
        if many is not None and len(writes) > 1:
            try:
                many(writes)
                alone = []
            except Exception:  # noqa: BLE001 — retried run by run: a bad update fails its run only
                log.warning("a step's round writes failed together; writing them one by one", exc_info=True)
        for run_id, up in alone:
            try:
                self.store.update(run_id, up)
            except Exception as e:  # noqa: BLE001
                failed.append(self._fail(self.runs[run_id], e, up))
        dt = (time.perf_counter() - t) / len(writes)
        for run_id, _ in writes:
            run = self.runs.get(run_id)
            if run is not None:
                run.timings["tree"] += dt
        self.cpu["store"] += self._clock() - c
        return failed

    def _account(self, runs, forward, routing, guidance, who) -> None:
        self.timings["forward"] += forward
        self.timings["scheduling"] += routing
        self.timings["guidance"] += guidance
        per_run: dict[str, int] = {}
        for run, _ in who:
            per_run[run.run_id] = per_run.get(run.run_id, 0) + 1
        for run in runs:
            run.timings["forward"] += forward
            run.timings["scheduling"] += routing / len(runs)
            if who:
                run.timings["guidance"] += guidance * per_run.get(run.run_id, 0) / len(who)

    def _kv_evict(self) -> None:
        """Scheduler view: above a run's KV ratio r, evict the lowest-ranked resident trace (once). Both
        this and the engine's own eviction (out of blocks: the lowest priority, the trace's score) rank
        on every boundary scored so far, as with an in-process scorer: a remote scorer's calls in flight
        are applied first (STEP's go every step, and were applied at its rounds only)."""
        usage = self.engine.kv_usage()
        if usage > self._evict_ratio():
            if self.deferred:
                self._score(self._take_deferred())
            if self.pending:
                self._settle({r.run_id for r in kv_evict.over_ratio(self._launched(), usage)})
            self._evict_lowest(usage)
        if (self.pending or self.deferred) and self._engine_may_evict():
            # the engine evicts by priority inside its next step: Gambit's deferred boundaries go now
            # (at r = 1, or a step that forks or prefills past the free blocks, it evicted by scores
            # up to Δ steps old)
            if self.deferred:
                self._score(self._take_deferred())
            if self.pending:
                self._settle()

    def _evict_lowest(self, usage: float) -> None:
        worst = kv_evict.lowest_resident(self._launched(), usage)
        if worst is not None:
            run, node = worst
            self.engine.abort(node.engine_id)
            run.evict(node)

    def _engine_may_evict(self) -> bool:
        return kv_evict.engine_may_evict(self.engine)

    def _runs_changed(self) -> None:
        """The set of runs changed (one entered ``runs``, launched or ended): what is kept per set goes."""
        self._ratio = self._mode = None

    def _events_mode(self, runs: list[SearchRun]) -> tuple[bool, bool | str]:
        """(whether a run reads token events, ``Engine.step``'s ``token_events``), kept until the set of
        runs changes (it was three scans of every run's config a step). Token events only for runs that
        read them (DeepConf's windows; speculative runs' Δ clocks, in the steps that drafted): the
        others read their tokens from the engine traces (``SearchRun.sync``)."""
        if self._mode is None:
            per_token = any(r.per_token for r in runs)
            spec = any(r.cfg.decoding != "plain" for r in runs)
            self._mode = per_token, True if per_token else "drafted" if spec else False
        return self._mode

    def _evict_ratio(self) -> float:
        """``kv_evict.evict_ratio``, kept until the set of runs changes (it was a scan of every run's
        config twice a step)."""
        if self._ratio is None:
            self._ratio = kv_evict.evict_ratio(self._launched())
        return self._ratio

    def _finish(self, run: SearchRun, reason: str) -> RunResult:
        """End ``run`` with its vote and write it; if that raises, it ends as "failed" (``_fail``)."""
        c = self._clock()
        try:
            if self.deferred:
                self._score(self._take_deferred(run))
            if self.pending:
                self.timings["guidance"] += self._settle({run.run_id})
            result = run.finish(reason)
            self.store.update(run.run_id, run.flush(self.lazy))
        except Exception as e:  # noqa: BLE001 — the run ends all the same, reported as failed
            result = self._fail(run, e)
        self.runs.pop(run.run_id, None)
        self._runs_changed()
        self.cpu["finish"] += self._clock() - c
        return result

    def _fail(self, run: SearchRun, error: Exception, up: RunUpdate | None = None) -> RunResult:
        """End ``run`` as "failed" after its part of a step raised: its traces stopped and their KV
        freed, its vote over what finished, the error in ``RunResult.error``, every node rewritten
        (``up``: a round update that was not written, its rounds kept). The store write is tried
        once; the other runs go on."""
        msg = f"{type(error).__name__}: {error}"
        log.error("run %s failed: %s", run.run_id, msg, exc_info=error)
        self._unhold(run.run_id)
        self._take_deferred(run)
        try:
            run.stop_all(T.STOPPED, "failed")
        except Exception:  # noqa: BLE001 — its engine traces are freed below all the same
            log.exception("run %s: traces not stopped cleanly", run.run_id)
        for eid in [eid for eid, o in self.owner.items() if o[0] is run]:
            self.owner.pop(eid, None)
            try:
                self.engine.abort(eid)
            except Exception:  # noqa: BLE001 — already gone in the engine
                pass
        try:
            result = run.finish("failed")
        except Exception:  # noqa: BLE001 — its vote is what failed: a result without one
            result = run.result = RunResult(
                run.run_id, run.cfg.method, None, None, None, "none", {}, {}, [], run.tokens, 0, run.round,
                run.pruned, run.branched, run.evicted, time.perf_counter() - run.t0, dict(run.timings),
                "failed", prompt_tokens=len(run.prompt_ids))
        result.error = msg
        if up is not None:
            run.pending_rounds[:0] = up.rounds
        run.dirty |= set(run.nodes)
        try:
            self.store.update(run.run_id, run.flush(self.lazy))
        except Exception:  # noqa: BLE001 — the result is returned all the same
            log.exception("run %s: failed result not written", run.run_id)
        self.runs.pop(run.run_id, None)
        self._runs_changed()
        return result
