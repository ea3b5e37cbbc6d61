"""A small multi-run search driver over one engine + scorer: the services' stand-in until the
tournament driver (``gambit.search``, CONTRACTS §5) lands, with the same shape: ``submit``,
``step`` → progress/result records, ``cancel``.

Per run: C root traces; every Δ decode steps a round ranks the run's live traces by the mean score
of their boundaries and (gambit) prunes the bottom K and forks the top K eligible ones (≥ w tokens
since creation; zero-sum), (step) prunes the bottom K only, (sc, deepconf) only reports. Evicted
traces are ghosts. The tree view goes to a ``TreeView`` (Redis or memory) once per round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gambit.engine.engine import derive_seed
from gambit.engine.events import BoundaryEvent, EvictedEvent, FinishedEvent, TokenEvent
from gambit.engine.sequence import SamplingParams
from gambit.search.vote import majority_vote, weighted_vote
from gambit.serving.solve_config import SolveConfig
from gambit.tasks.answers import extract_boxed


@dataclass
class TraceRec:
    id: int
    parent: int
    birth_tokens: int  # tokens it had when created (forks inherit the parent's)
    temperature: float
    tokens: int = 0
    scores: list[float] = field(default_factory=list)
    active: bool = True
    resident: bool = True
    reason: str = ""
    output: tuple[int, ...] = ()

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


@dataclass
class RunProgress:
    run_id: str
    round: int
    active: int
    ghost: int
    pruned: int
    branched: int
    finished: int
    tokens: int
    kv_usage: float
    elapsed_s: float


@dataclass
class RunResult:
    run_id: str
    status: str
    answer: str
    majority_answer: str
    weighted_answer: str
    majority_votes: dict[str, float]
    weighted_votes: dict[str, float]
    traces: list[dict]
    generated_tokens: int
    prompt_tokens: int
    rounds: int
    total_s: float
    message: str = ""


@dataclass
class Run:
    id: str
    problem: str
    cfg: SolveConfig
    prompt_len: int
    started: float
    traces: dict[int, TraceRec] = field(default_factory=dict)
    steps: int = 0
    round: int = 0
    tokens: int = 0
    pruned_total: int = 0
    branched_total: int = 0


class MiniDriver:
    def __init__(self, engine, scorer=None, tree=None, metrics=None) -> None:
        self.engine, self.scorer, self.tree, self.metrics = engine, scorer, tree, metrics
        self.runs: dict[str, Run] = {}
        self.owner: dict[int, str] = {}  # trace id -> run id
        self.pending: list[tuple[list[TraceRec], object]] = []  # (rows, future of their scores)
        self.sync_seconds = 0.0  # decoding blocked on the scorer (guidance sync)

    # -- API ---------------------------------------------------------------------------------
    def submit(self, run_id: str, problem: str, cfg: SolveConfig) -> str:
        if run_id in self.runs:
            raise ValueError(f"run_id: {run_id!r} is already running")
        if cfg.decoding != "plain" and "decoding" not in SamplingParams.__dataclass_fields__:
            raise NotImplementedError(f"decoding {cfg.decoding!r} needs speculative decoding, "
                                      "not in this build")
        ids = self.engine.tokenizer.encode(problem)
        run = Run(run_id, problem, cfg, len(ids), time.perf_counter())
        added = []
        try:
            for i in range(cfg.capacity):
                sp = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                    seed=derive_seed(cfg.seed, i))
                added.append(self.engine.add(ids, sp))
        except ValueError as e:
            for t in added:
                self.engine.abort(t)
            raise ValueError(f"problem: {e}") from None
        for t in added:
            run.traces[t] = TraceRec(t, -1, 0, cfg.temperature)
            self.owner[t] = run_id
        self.runs[run_id] = run
        self._metric("inc", "gambit_traces_started_total", len(added))
        self._save(run)
        return run_id

    def cancel(self, run_id: str, status: str = "cancelled", message: str = "") -> RunResult | None:
        run = self.runs.get(run_id)
        if run is None:
            return None
        for t in run.traces.values():
            if t.active and t.resident and not t.reason:
                self.engine.abort(t.id)
                t.reason = "abort"
        return self._finish(run, status, message)

    def has_work(self) -> bool:
        return bool(self.runs)

    def step(self) -> list[RunProgress | RunResult]:
        out: list[RunProgress | RunResult] = []
        events = self.engine.step()
        keys, states, rows = [], [], []
        stepped: set[str] = set()
        for ev in events:
            rid = self.owner.get(ev.trace_id)
            run = self.runs.get(rid) if rid is not None else None
            if run is None:
                continue
            tr = run.traces[ev.trace_id]
            if isinstance(ev, TokenEvent):
                tr.tokens += 1
                run.tokens += 1
                stepped.add(rid)
            elif isinstance(ev, BoundaryEvent):
                keys.append(f"{rid}:{ev.trace_id}")
                states.append(ev.hidden)
                rows.append(tr)
            elif isinstance(ev, FinishedEvent):
                tr.output, tr.active, tr.resident = ev.output_ids, False, False
                tr.reason = tr.reason or ev.reason
                self._metric("inc", "gambit_traces_finished_total", 1, reason=tr.reason)
                self._drop(f"{rid}:{ev.trace_id}")
                self.owner.pop(ev.trace_id, None)
            elif isinstance(ev, EvictedEvent):
                tr.output, tr.resident = ev.output_ids, False  # a ghost: still active in the tree
                self._metric("inc", "gambit_evictions_total", 1)
        if keys and self.scorer is not None:
            import torch

            t0 = time.perf_counter()
            if hasattr(self.scorer, "score_async"):  # remote: overlap the call with the next steps
                self.pending.append((rows, self.scorer.score_async(keys, torch.stack(states))))
            else:
                self._apply(rows, self.scorer.score(keys, torch.stack(states)))
            self.sync_seconds += time.perf_counter() - t0
        for rid in stepped:
            run = self.runs[rid]
            run.steps += 1
            if run.steps % run.cfg.round_interval == 0:
                out.append(self._round(run))
        for run in list(self.runs.values()):
            if run.cfg.timeout_s and time.perf_counter() - run.started > run.cfg.timeout_s:
                out.append(self.cancel(run.id, "timeout", f"run exceeded timeout_s={run.cfg.timeout_s}"))
            elif not any(t.active and t.resident for t in run.traces.values()):
                out.append(self._finish(run, "done"))
        return out

    # -- rounds ------------------------------------------------------------------------------
    @staticmethod
    def _apply(rows: list[TraceRec], scores) -> None:
        for tr, s in zip(rows, scores.tolist(), strict=True):
            tr.scores.append(float(s))

    def _settle(self) -> None:
        """Wait for scores still in flight (rounds and votes rank on every boundary so far)."""
        t0 = time.perf_counter()
        for rows, fut in self.pending:
            self._apply(rows, fut.result())
        self.pending.clear()
        self.sync_seconds += time.perf_counter() - t0

    def _round(self, run: Run) -> RunProgress:
        self._settle()
        cfg = run.cfg
        run.round += 1
        live = [t for t in run.traces.values() if t.active and not t.reason]
        pruned = branched = 0
        if cfg.method in ("gambit", "step") and cfg.swap and len(live) > 1:
            ranked = sorted(live, key=lambda t: (t.mean, -t.id))
            eligible = [t for t in ranked if t.tokens >= cfg.warmup]
            k = min(cfg.swap, len(eligible) // 2)
            for t in eligible[:k]:  # bottom K
                if t.resident:
                    self.engine.abort(t.id)
                t.active, t.reason = False, "pruned"
                pruned += 1
            if cfg.method == "gambit":
                tops = [t for t in reversed(eligible[k:]) if t.resident][:k]
                for t in tops:
                    temp = min(10.0, t.temperature * cfg.child_temperature)
                    (cid,) = self.engine.fork(t.id, 1, seeds=[derive_seed(cfg.seed, run.round, t.id)],
                                              temperatures=[temp])
                    run.traces[cid] = TraceRec(cid, t.id, t.birth_tokens + t.tokens, temp,
                                               scores=list(t.scores))
                    self.owner[cid] = run.id
                    if self.scorer is not None and hasattr(self.scorer, "fork"):
                        self.scorer.fork(f"{run.id}:{t.id}", f"{run.id}:{cid}")
                    branched += 1
        run.pruned_total += pruned
        run.branched_total += branched
        m = cfg.method
        self._metric("inc", "gambit_rounds_total", 1, method=m)
        self._metric("inc", "gambit_prunes_total", pruned, method=m)
        self._metric("inc", "gambit_branches_total", branched, method=m)
        self._metric("inc", "gambit_traces_started_total", branched)
        self._save(run)
        ts = run.traces.values()
        return RunProgress(run.id, run.round, sum(t.active and t.resident for t in ts),
                           sum(t.active and not t.resident for t in ts), pruned, branched,
                           sum(bool(t.reason) and t.reason != "pruned" for t in ts), run.tokens,
                           self.engine.kv_usage(), time.perf_counter() - run.started)

    def _finish(self, run: Run, status: str, message: str = "") -> RunResult:
        self._settle()
        self.runs.pop(run.id, None)
        for t in run.traces.values():
            self.owner.pop(t.id, None)
            self._drop(f"{run.id}:{t.id}")
        voters = [t for t in run.traces.values() if t.reason not in ("pruned", "abort") and t.output]
        answers = [extract_boxed(self.engine.tokenizer.decode(list(t.output))) for t in voters]
        weights = [t.mean if t.scores else 0.0 for t in voters]
        maj = majority_vote(answers) or ""
        wei = weighted_vote(answers, weights) or ""
        mv: dict[str, float] = {}
        wv: dict[str, float] = {}
        for a, w in zip(answers, weights, strict=True):
            if a is not None:
                mv[a] = mv.get(a, 0) + 1
                wv[a] = wv.get(a, 0) + w
        traces = []
        for t in run.traces.values():
            text = self.engine.tokenizer.decode(list(t.output)) if t.output else ""
            traces.append(dict(trace_id=t.id, parent_id=t.parent, answer=extract_boxed(text) or "",
                               score=t.mean, tokens=t.tokens, finish_reason=t.reason or "abort"))
        answer = wei if run.cfg.method in ("gambit", "step") and any(weights) else maj
        res = RunResult(run.id, status, answer, maj, wei, mv, wv, traces, run.tokens, run.prompt_len,
                        run.round, time.perf_counter() - run.started, message)
        self._save(run, res)
        return res

    def _save(self, run: Run, result: RunResult | None = None) -> None:
        if self.tree is None:
            return
        self.tree.put_traces(run.id, {t.id: dict(parent=t.parent, birth=t.birth_tokens, tokens=t.tokens,
                                                 scores=t.scores, active=t.active, resident=t.resident,
                                                 reason=t.reason) for t in run.traces.values()})

    def _drop(self, key: str) -> None:
        if self.scorer is not None and hasattr(self.scorer, "drop"):
            self.scorer.drop(key)

    def _metric(self, how: str, name: str, value: float, **labels) -> None:
        if self.metrics is not None:
            getattr(self.metrics, how)(name, value, **labels)
