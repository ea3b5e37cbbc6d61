"""The driver's admission of runs: the batch-slot hold and the takeover of stored runs.

A submitted or adopted run enters ``held`` and launches at the first step where its pool fits the
engine's batch (``batch_slots.fits``), first come, first served; one whose ``max_wall_s`` passes while
held ends "limit" unlaunched. A run taken over (``adopt``, ``recover``) is rebuilt from its stored tree
and admitted the same way, unless a trace of it is still live in this engine. A Gambit C above the
batch is refused at both doors (``batch_slots.check``): submit and adopt raise ``OverBatch``,
``recover`` ends such a run in the store with reason "limit" saying why (it never fits here).

``SearchDriver`` mixes it in; it needs ``engine``, ``scorer``, ``store``, ``lazy``, ``runs``, ``owner``,
``held``, ``_restored``, ``_runs_changed`` and ``_finish`` on the instance.
"""

from __future__ import annotations

import time

from gambit.search import batch_slots
from gambit.search import tree as T
from gambit.search.config import SearchConfig
from gambit.search.results import RunResult
from gambit.search.run_state import SearchRun
from gambit.search.store import RunUpdate, TreeStore
from gambit.search.tree import Node


class Admission:
    """Mixed into ``SearchDriver`` (one object: submit, step, cancel and the takeover share its queues).
    The driver's state it reads is declared below; it also calls the driver's ``_runs_changed`` and
    ``_finish`` (no stubs here: one would shadow a later base's method in the MRO)."""

    engine: object
    scorer: object
    store: TreeStore
    lazy: bool
    runs: dict[str, SearchRun]
    owner: dict[int, tuple[SearchRun, int, Node]]
    held: dict[str, SearchRun]
    _restored: set[str]

    # -- batch slots ----------------------------------------------------------------------------
    def _max_seqs(self) -> int | None:
        return batch_slots.max_seqs(self.engine)

    def _check_batch(self, cfg: SearchConfig) -> None:
        """Refuse a run that would never fit this engine's batch, even alone (``batch_slots.check``)."""
        batch_slots.check(cfg.method, cfg.capacity, self._max_seqs())

    def _launched(self) -> list[SearchRun]:
        """The runs that hold engine traces (or will this step): every run but the held ones."""
        if not self.held:
            return list(self.runs.values())
        return [r for r in self.runs.values() if r.run_id not in self.held]

    def _fits(self, run: SearchRun) -> bool:
        """Whether ``run`` may launch now beside the launched runs (``batch_slots.fits``)."""
        return batch_slots.fits(run, self._launched(), self._max_seqs())

    def _unhold(self, run_id: str) -> None:
        """``run_id`` leaves the held queue (launched, ended or refused)."""
        self.held.pop(run_id, None)
        self._restored.discard(run_id)

    def _enqueue(self, run: SearchRun) -> None:
        """Hold ``run`` behind the held runs and launch what fits (``_admit``); on an error it is gone."""
        self._register(run)
        self.held[run.run_id] = run
        try:
            self._admit()
        except Exception:
            self._unhold(run.run_id)
            self.runs.pop(run.run_id, None)
            self._runs_changed()
            raise

    def _admit(self) -> None:
        """Launch the held runs in submission order while the first one fits (``_fits``): a run
        behind a held Gambit run waits too, so a stream of small runs cannot starve it. Its clock is
        not reset here: it runs from its submit (``SearchRun.t0``), the wait included."""
        while self.held:
            run = next(iter(self.held.values()))
            if not self._fits(run):
                return
            del self.held[run.run_id]
            self._runs_changed()
            if run.run_id in self._restored:
                self._restored.discard(run.run_id)
                self._relaunch(run)
            else:
                run.start()
                self.store.update(run.run_id, run.flush(self.lazy))

    def _expire_held(self) -> list[RunResult]:
        """End the held runs whose ``max_wall_s`` passed while they waited (their clock runs from the
        submit): reason "limit", the limit saying they timed out queued. They launched no trace, so
        they free no slot and no KV (a restored one keeps its stored tree, its resident nodes stopped)."""
        out = []
        for run in batch_slots.out_of_time(self.held.values()):
            self._unhold(run.run_id)
            run.limit_hit = batch_slots.queued_limit(run)
            run.stop_all(T.STOPPED, "limit")
            out.append(self._finish(run, "limit"))
        return out

    # -- coordinator restart --------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Reload every unfinished run from the store; adopt its live engine traces, recompute others.
        A run this engine's batch can never hold (``OverBatch``) is ended in the store instead, so it is
        neither left unfinished nor launched to branch on (``_refuse``); the others are taken back."""
        back = []
        for run_id in self.store.unfinished():
            if run_id in self.runs:
                continue
            data = self.store.load(run_id)
            if data is None:
                continue
            try:
                self.adopt(run_id, data)
            except batch_slots.OverBatch as e:
                self._refuse(run_id, data, str(e))
                continue
            back.append(run_id)
        return back

    def adopt(self, run_id: str, data: dict) -> SearchRun:
        """Take over a run from its stored tree (``store.load``) and step it from now on. It is admitted
        as a submitted run is (held until its C fits the batch, behind the runs held before it: several
        restored Gambit runs overfilled the batch; refused, ``OverBatch``, where its C never fits, as
        ``submit`` refuses it), unless a trace of it is live in this engine (a coordinator restart):
        then its traces hold their slots already, and it launches at once."""
        if run_id in self.runs:
            raise ValueError(f"run {run_id} already exists")
        run = self._restore(run_id, data)
        resident = [n for n in run.nodes.values() if n.resident]
        if any(self._live(run, n) is not None for n in resident):
            self._resumed(run, data)
            self._register(run)
            self._relaunch(run)
            return run
        self._check_batch(run.cfg)  # before anything is written: a refused run's tree stays as it was
        self._resumed(run, data)
        for node in resident:  # another engine's ids (or gone from this one): never abort by them
            node.engine_id = None
        self._restored.add(run_id)
        self._enqueue(run)
        return run

    def _refuse(self, run_id: str, data: dict, why: str) -> RunResult:
        """End a stored run that ``recover`` cannot take over (its C above this engine's batch): its
        resident traces stopped where the store has them, reason "limit" naming the batch."""
        run = self._restore(run_id, data)
        for node in run.nodes.values():
            if node.resident:
                node.engine_id = None  # another engine's ids: never abort by them
        run.limit_hit = f"{why} (not taken over)"
        self._register(run)
        run.stop_all(T.STOPPED, "limit")
        return self._finish(run, "limit")

    def _register(self, run: SearchRun) -> SearchRun:
        """Every run enters ``runs`` here (and leaves in ``_finish``): the per-set caches follow."""
        self.runs[run.run_id] = run
        self._runs_changed()
        return run

    def _restore(self, run_id: str, data: dict) -> SearchRun:
        """The run as stored; nothing is written (``_resumed`` says it was taken over)."""
        meta = data["meta"]
        cfg = SearchConfig.from_dict(meta["config"])
        run = SearchRun(run_id, cfg, meta["prompt"], meta["prompt_ids"], meta["gold"], self.engine,
                        self.scorer, self.owner)
        for k in ("step", "round", "tokens", "pruned", "branched", "evicted", "phase", "threshold"):
            setattr(run, k, meta[k])
        run.target = meta.get("target", cfg.capacity)
        # the run's clock goes on from its first admission (max_wall_s, elapsed): it restarted at every
        # takeover, so a 60 s run taken over at 50 s ran ~110 s (records from before it: from now)
        if meta.get("started_at") is not None:
            run.started_at = float(meta["started_at"])
            run.t0 -= max(0.0, time.time() - run.started_at)
        # Δ's clock (records from before it: a plain run's clock is its step count)
        run.clock = float(meta.get("clock", run.step))
        run.next_round = meta.get("next_round", (run.step // cfg.interval + 1) * cfg.interval)
        run.nodes = {i: Node.from_dict(d) for i, d in sorted(data["nodes"].items())}
        run.active = {i for i, n in run.nodes.items() if n.active}
        run.written = {i: n.depth for i, n in run.nodes.items()}
        run.recount()
        run.meta_written = True
        if cfg.method == "deepconf":
            from gambit.search.deepconf import ConfidenceWindow

            run.windows = {i: ConfidenceWindow(cfg.deepconf_window) for i in run.nodes}
        run.dirty = set(run.nodes)
        return run

    def _resumed(self, run: SearchRun, data: dict) -> None:
        """The tree says it was taken over, and at which step: the clock goes on from the stored step while
        each trace restarts from its stored tokens, which lag by design (``SearchRun.flush``), so from
        here a trace's tokens trail the steps (`gambit inspect` says so in its header)."""
        resumed = [*data["meta"].get("resumed_at", []), run.step]
        self.store.update(run.run_id, RunUpdate(meta={"resumed_at": resumed}))

    def _live(self, run: SearchRun, node: Node):
        """The engine trace a restored resident node left running here, if it is still its own."""
        live = self.engine.traces.get(node.engine_id) if node.engine_id is not None else None
        expected = run.prompt_ids + node.tokens
        if live is not None and not live.is_done and live.token_ids[:len(expected)] == expected:
            return live
        return None

    def _relaunch(self, run: SearchRun) -> None:
        """A restored run's resident traces: adopt those live in the engine, recompute the others.
        A restored trace's confidence minimum restarts (it lived in the old coordinator's memory)."""
        for node in run.nodes.values():
            if not node.resident:
                continue
            live = self._live(run, node)
            if live is not None:
                run.traces[node.id] = live
                run.sync(node)  # the tokens generated after the last write
                self.owner[node.engine_id] = (run, node.id, node)
            else:
                run._launch(node)  # the engine lost it: recompute from its tokens
