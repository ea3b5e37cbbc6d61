"""A Solve request as a validated dataclass: every bad value is a ValueError naming its field.

Field names match the proto (``SolveRequest``) so the gRPC layer can answer INVALID_ARGUMENT with
the message as is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from gambit.search.config import MAX_WALL_S, check_deepconf_pool, check_greedy_pool
from gambit.tasks.graded import ANSWER_KINDS

METHODS = ("gambit", "sc", "step", "deepconf")
DECODINGS = ("plain", "eagle3.1", "pr")
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_PROBLEM_CHARS = 8192


@dataclass
class SolveConfig:
    """One run's search settings (server defaults fill what a request leaves at 0/unset)."""

    method: str = "gambit"  # gambit | sc | step | deepconf
    decoding: str = "plain"  # plain | eagle3.1 | pr
    capacity: int = 8  # C: traces alive at once
    swap: int = 2  # K: traces pruned and branched per round
    round_interval: int = 16  # Δ: decode steps between rounds
    warmup: int = 16  # w: tokens a trace needs since its creation before it can be pruned or branched
    max_tokens: int = 320  # generated tokens per trace at most
    max_total_tokens: int = 0  # generated tokens over the whole run at most, all traces (0 = none)
    temperature: float = 0.8  # sampling temperature of root traces
    child_temperature: float = 1.0  # temperature multiplier for branched children
    top_p: float = 1.0  # nucleus mass of every trace's sampling, (0, 1] (1 = no nucleus)
    top_k: int = 0  # top-k filter of every trace's sampling (0 = none)
    seed: int = 0  # run seed
    timeout_s: float = 0.0  # wall-clock limit of the run, seconds (0 = none)
    raw_prompt: bool = False  # the problem goes to the model as it is (False: the model's prompt format)
    answer_rule: str = "boxed"  # how a trace's answer is read: boxed | integer | gsm8k | choice | latex

    def __post_init__(self) -> None:
        self._check_types()
        if self.method not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; known: {', '.join(METHODS)}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding: unknown decoding {self.decoding!r}; known: {', '.join(DECODINGS)}")
        if self.answer_rule not in ANSWER_KINDS:
            raise ValueError(f"answer_rule: unknown rule {self.answer_rule!r}; "
                             f"known: {', '.join(ANSWER_KINDS)}")
        if self.capacity < 1:
            raise ValueError(f"capacity: C must be >= 1, got {self.capacity}")
        check_deepconf_pool(self.method, self.capacity, "C", field="capacity: ")
        if not 0 <= self.swap <= self.capacity:
            raise ValueError(f"swap: K must be in [0, C={self.capacity}], got {self.swap}")
        if self.round_interval < 1:
            raise ValueError(f"round_interval: must be >= 1, got {self.round_interval}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if self.max_total_tokens < 0:
            raise ValueError(f"max_total_tokens: must be >= 0 (0 = none), got {self.max_total_tokens}")
        if not self.temperature >= 0 or self.temperature > 10:
            raise ValueError(f"temperature: must be in [0, 10], got {self.temperature}")
        check_greedy_pool(self.method, self.temperature, self.capacity, "C", field="capacity: ")
        if not 0 < self.child_temperature <= 10:
            raise ValueError(f"child_temperature: must be in (0, 10], got {self.child_temperature}")
        if not 0 < self.top_p <= 1:  # NaN fails too
            raise ValueError(f"top_p: must be in (0, 1] (1 = no nucleus), got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0 (0 = none), got {self.top_k}")
        if self.seed < 0:
            raise ValueError(f"seed: must be >= 0, got {self.seed}")
        if not 0 <= self.timeout_s <= MAX_WALL_S:  # NaN fails too; inf is not "none" (that is 0)
            raise ValueError(f"timeout_s: must be in [0, {MAX_WALL_S:g}] seconds (0 = none), "
                             f"got {self.timeout_s}")

    def _check_types(self) -> None:
        """The proto's types, for a config built in Python (``Embedded.solve``): max_tokens="8" raised
        TypeError from a comparison, capacity=2.5 a ValueError without its field, at admission."""
        for f in fields(self):
            v, kind = getattr(self, f.name), type(f.default)
            ok = isinstance(v, bool) if kind is bool else \
                not isinstance(v, bool) and isinstance(v, (int, float) if kind is float else kind)
            if not ok:
                want = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
                raise ValueError(f"{f.name}: must be {want}, got {v!r}")


def server_defaults(defaults: dict | None = None) -> SolveConfig:
    """A server's run defaults (``SolveConfig`` fields). A default K above the default C is taken as C,
    so a small default capacity needs no swap of its own: the rule of ``gambit serve --swap`` and of the
    chart's ``serve.solveDefaults``, where it used to fail every Coordinator replica at start."""
    d = dict(defaults or {})
    if "swap" in d:
        d["swap"] = min(d["swap"], d.get("capacity", SolveConfig.capacity))
    return SolveConfig(**d)


def check_problem(problem: str, max_chars: int = MAX_PROBLEM_CHARS) -> str:
    """A problem gRPC could carry: text, not blank, not too long, and valid UTF-8. A lone surrogate (a
    Python string from ``Embedded.solve``; gRPC refuses it at the client) raised TypeError from the
    tokenizer at admission."""
    if not isinstance(problem, str):
        raise ValueError(f"problem: must be a string, got {type(problem).__name__}")
    if not problem.strip():
        raise ValueError("problem: empty")
    if len(problem) > max_chars:
        raise ValueError(f"problem: {len(problem)} characters, at most {max_chars}")
    try:
        problem.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"problem: not valid UTF-8 text: {problem[e.start:e.end]!r} at character {e.start} "
                         "(a lone surrogate)") from None
    return problem


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):  # match's $ also matched before a final newline: 'abc\n' passed
        raise ValueError(f"run_id: {run_id[:80]!r} must be 1-64 characters of [A-Za-z0-9_-]")
    return run_id


def from_request(req, defaults: SolveConfig | None = None) -> tuple[str, SolveConfig]:
    """``(problem, config)`` from a ``gambit.v1.SolveRequest``; zero/unset fields take ``defaults``."""
    d = defaults or SolveConfig()
    problem = check_problem(req.problem)
    capacity = req.capacity if req.HasField("capacity") else d.capacity
    cfg = SolveConfig(
        method=req.method or d.method,
        decoding=req.decoding or d.decoding,
        capacity=capacity,
        swap=req.swap if req.HasField("swap") else max(0, min(d.swap, capacity)),
        round_interval=req.round_interval or d.round_interval,
        warmup=d.warmup,
        max_tokens=req.max_tokens or d.max_tokens,
        max_total_tokens=req.max_total_tokens or d.max_total_tokens,
        temperature=req.temperature if req.HasField("temperature") else d.temperature,
        child_temperature=d.child_temperature,
        top_p=req.top_p if req.HasField("top_p") else d.top_p,
        top_k=req.top_k if req.HasField("top_k") else d.top_k,
        seed=req.seed,
        timeout_s=req.timeout_s or d.timeout_s,
        raw_prompt=req.raw_prompt,
        answer_rule=req.answer_rule or d.answer_rule,
    )
    return problem, cfg
