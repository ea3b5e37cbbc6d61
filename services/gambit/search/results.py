"""What the driver reports: one ``Progress`` per round of a run, one ``RunResult`` when it ends."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Progress:
    run_id: str
    method: str
    round: int
    step: int
    active: int  # tree view: running + ghost
    ghosts: int
    resident: int  # scheduler view: holding KV
    pruned: int  # so far
    branched: int
    evicted: int
    finished: int
    tokens: int
    kv_usage: float
    votes: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunResult:
    run_id: str
    method: str
    answer: str | None  # the method's own vote (see ``vote_rule``)
    majority: str | None
    weighted: str | None  # score-weighted (gambit, step) or confidence-weighted (deepconf) vote
    vote_rule: str
    votes: dict[str, int]
    weighted_votes: dict[str, float]
    traces: list[dict]  # per-trace summary: id, parent, state, answer, tokens, score
    tokens: int  # generated tokens of the run
    finished_traces: int  # traces that ended by themselves with an answer
    rounds: int
    pruned: int
    branched: int
    evicted: int
    wall_s: float
    timings: dict[str, float]  # forward, guidance, tree, scheduling (seconds)
    reason: str  # done | decided | limit | cancelled | failed
    correct: bool | None = None  # when the problem's answer was given
    deepconf_threshold: float | None = None
    prompt_tokens: int = 0  # the prompt's tokens (every trace starts from them)
    solution: str = ""  # the text of the best-ranked finished trace that gave ``answer`` ("" = no answer)
    solution_trace: int | None = None  # that trace's id
    limit: str = ""  # for reason "limit": which one, e.g. "max_total_tokens 4000" or "max_wall_s 30"
    error: str = ""  # for reason "failed": the error that ended the run (``SearchDriver._fail``)

    def to_dict(self) -> dict:
        # shallow: asdict deep-copies every trace summary, and the store serialises this at once
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def trace_throughput(self) -> float:
        """Finished (answered) traces per second of wall time."""
        return self.finished_traces / self.wall_s if self.wall_s > 0 else 0.0
