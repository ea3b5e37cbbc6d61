"""The services' view of the tournament driver (``gambit.search.driver.SearchDriver``).

Maps a validated ``SolveConfig`` to a ``SearchConfig``, the driver's ``Progress``/``RunResult``
to the API's records (``convert.py``), routes the tree store's writes through the Target's record
writer (off the engine thread; replayed in order after a Redis outage), and feeds the metrics.
"""

from __future__ import annotations

from dataclasses import asdict

from gambit.search.config import SearchConfig
from gambit.search.driver import SearchDriver
from gambit.search.results import Progress, RunResult
from gambit.serving.record_writer import InlineRecords
from gambit.serving.solve_config import SolveConfig

REASON = {"finished": "eos", "pruned": "pruned", "evicted": "evicted", "stopped": "abort",
          "ghost": "evicted", "running": "abort", "waiting": "abort"}  # node state -> metric reason label
# where the node's end_reason says more: its token limit, or a method's rule (DeepConf's confidence
# threshold, a vote already decided) rather than a cancel or a run limit
END_REASON = {"length": "length", "deepconf": "stopped", "decided": "stopped"}


def search_config(cfg: SolveConfig) -> SearchConfig:
    return SearchConfig(method=cfg.method, decoding=cfg.decoding, capacity=cfg.capacity,
                        swap=cfg.swap, interval=cfg.round_interval, warmup=cfg.warmup,
                        child_temperature=cfg.child_temperature, temperature=cfg.temperature,
                        top_p=cfg.top_p, top_k=cfg.top_k,
                        max_tokens=cfg.max_tokens, max_total_tokens=cfg.max_total_tokens,
                        max_wall_s=cfg.timeout_s, seed=cfg.seed, answer_rule=cfg.answer_rule)


class WrittenStore:
    """The driver's TreeStore with its writes routed through the Target's record writer (async for
    Redis, where a failed write is kept and replayed in order); reads go to the store itself."""

    def __init__(self, store, writes) -> None:
        self.store, self.writes = store, writes

    def update(self, run_id, up) -> None:
        self.writes.update(run_id, up)

    def update_many(self, items) -> None:
        """Defined here so that ``__getattr__`` never hands the store's own (unrouted) one out."""
        for run_id, up in items:
            self.writes.update(run_id, up)

    def __getattr__(self, name):
        return getattr(self.store, name)


class DriverAdapter:
    """``submit/step/cancel`` in the API's terms over one ``SearchDriver``."""

    def __init__(self, engine, scorer=None, store=None, metrics=None, writes=None) -> None:
        """``writes``: a record writer (``record_writer``) the store's updates go through."""
        self.scorer, self.metrics = scorer, metrics
        if store is not None:
            store = WrittenStore(store, writes if writes is not None else InlineRecords(store))
        self.driver = SearchDriver(engine, scorer, store)
        self.last: dict[str, dict] = {}  # run id -> last progress (cumulative counters)
        self.runs = self.driver.runs

    @property
    def sync_seconds(self) -> float:
        return self.driver.timings["guidance"]

    def has_work(self) -> bool:
        return self.driver.has_work()

    def submit(self, run_id: str, problem: str, cfg: SolveConfig) -> str:
        try:
            self.driver.submit(problem, search_config(cfg), run_id=run_id)
        except ValueError as e:
            raise ValueError(f"problem: {e}") if "prompt" in str(e) else e from None
        self.last[run_id] = {"pruned": 0, "branched": 0, "evicted": 0, "active": 0, "ghosts": 0,
                             "resident": 0}
        self._inc("gambit_traces_started_total", cfg.capacity)
        return run_id

    def resume(self, run_id: str, problem: str, cfg: SolveConfig) -> bool:
        """Take over a run whose Target replica was lost: rebuild it from its tree in the store (every
        node kept, counters and rounds where the last write left them) and re-prefill each resident
        trace from its stored token ids (the lost engine's KV is gone; tokens generated after the last
        write are decoded again). True if restored; False if the store has no unfinished tree for it
        (the replica died before its first write): then it starts afresh under the same id."""
        data = self.driver.store.load(run_id)
        if data is None or data.get("result") is not None or not data["nodes"]:
            self.submit(run_id, problem, cfg)
            return False
        for node in data["nodes"].values():
            node["engine_id"] = None  # the lost replica's engine ids: never adopt a live trace here
        # SearchDriver.recover() does this for every unfinished run of a store; here only this one
        run = self.driver.adopt(run_id, data)
        # counters go on from the stored ones: the metrics count only what happens from here
        self.last[run_id] = {"pruned": run.pruned, "branched": run.branched, "evicted": run.evicted,
                             "active": 0, "ghosts": 0, "resident": 0}
        return True

    def cancel(self, run_id: str, status: str = "cancelled", message: str = "") -> dict | None:
        if run_id not in self.driver.runs:
            return None
        return self._result(self.driver.cancel(run_id), status, message)

    def step(self) -> list[dict]:
        out = []
        for ev in self.driver.step():
            out.append(self._progress(ev) if isinstance(ev, Progress) else self._result(ev))
        return out

    def gauges(self) -> tuple[int, int, int]:
        """Active, ghost and resident traces over the runs in flight (their last rounds)."""
        live = [self.last[r] for r in self.driver.runs if r in self.last]
        return (sum(p["active"] - p["ghosts"] for p in live), sum(p["ghosts"] for p in live),
                sum(p["resident"] for p in live))

    # -- mapping -------------------------------------------------------------------------------
    def _progress(self, p: Progress) -> dict:
        prev = self.last.get(p.run_id, {})
        for field, name in (("pruned", "gambit_prunes_total"), ("branched", "gambit_branches_total")):
            self._inc(name, getattr(p, field) - prev.get(field, 0), method=p.method)
        self._inc("gambit_traces_started_total", p.branched - prev.get("branched", 0))
        self._inc("gambit_evictions_total", p.evicted - prev.get("evicted", 0))
        self._inc("gambit_rounds_total", 1, method=p.method)
        self.last[p.run_id] = asdict(p)
        return {"kind": "progress", "run_id": p.run_id, "round": p.round, "active": p.active - p.ghosts,
                "ghost": p.ghosts, "pruned": p.pruned, "branched": p.branched, "finished": p.finished,
                "tokens": p.tokens, "kv_usage": p.kv_usage, "elapsed_s": p.wall_s,
                "votes": {k: float(v) for k, v in p.votes.items()}}

    def _result(self, r: RunResult, status: str | None = None, message: str = "") -> dict:
        self.last.pop(r.run_id, None)
        traces = []
        for t in r.traces:
            reason = END_REASON.get(t.get("end_reason") or "") or REASON.get(t.get("state", ""), "abort")
            self._inc("gambit_traces_finished_total", 1, reason=reason)
            traces.append({"trace_id": t["id"], "parent_id": -1 if t.get("parent") is None else t["parent"],
                           "answer": t.get("answer") or "", "score": float(t.get("score") or 0.0),
                           "tokens": t.get("own_tokens", 0), "finish_reason": t.get("state", ""),
                           "end_reason": t.get("end_reason") or ""})
        status = status or {"done": "done", "limit": "limit", "cancelled": "cancelled"}.get(r.reason,
                                                                                            r.reason)
        if r.reason == "limit" and not message:  # the request's name for it (it said timeout_s for both)
            limit = r.limit.replace("max_wall_s", "timeout_s") or "a run limit"
            message = f"{limit} reached ({r.tokens} tokens generated)"
        message = message or r.error  # a run the driver failed alone says why (``SearchDriver._fail``)
        return {"kind": "result", "run_id": r.run_id, "status": status, "answer": r.answer or "",
                "majority_answer": r.majority or "", "weighted_answer": r.weighted or "",
                "majority_votes": {k: float(v) for k, v in r.votes.items()},
                "weighted_votes": {k: float(v) for k, v in r.weighted_votes.items()}, "traces": traces,
                "generated_tokens": r.tokens, "prompt_tokens": r.prompt_tokens, "rounds": r.rounds,
                "total_s": r.wall_s,
                "message": message, "scorer_s": r.timings.get("guidance", 0.0),
                "engine_s": r.timings.get("forward", 0.0), "vote_rule": r.vote_rule, "solution": r.solution,
                "solution_trace": -1 if r.solution_trace is None else r.solution_trace}

    def _inc(self, name: str, value: float, **labels) -> None:
        if self.metrics is not None and value > 0:
            self.metrics.inc(name, value, **labels)
