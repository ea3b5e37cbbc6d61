"""One search run's configuration: method, pool shape, tournament knobs, sampling, limits."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from gambit.search import batch_slots
from gambit.tasks.graded import ANSWER_KINDS, check_answer_rule

MAX_WALL_S = 1e9  # the largest wall-time limit a run takes, seconds
MAX_TEMPERATURE = 10.0  # the largest sampling temperature: a root's, and a child's however it compounds

METHODS = ("gambit", "sc", "step", "deepconf")
RANKS = ("mean", "last", "min")
DECODINGS = ("plain", "eagle3.1", "pr")


def deepconf_warm(capacity: int, warmup: int = 0) -> int:
    """DeepConf's warm-up traces: ``warmup`` when set, or by default a fixed few (the paper fixes 16 of
    512) that leave at least one trace to hold to the threshold."""
    return warmup or max(1, min(4, capacity - 1))


def check_deepconf_pool(method: str, capacity: int, name: str = "capacity", field: str = "") -> None:
    """DeepConf needs a trace beyond its warm-up. ``name``: the caller's own name for C; ``field``: a
    prefix naming the request field (the API's errors start with it)."""
    if method == "deepconf" and capacity < 2:
        raise ValueError(f"{field}{name} must be >= 2 for method deepconf (warm-up traces set the threshold "
                         f"the later ones are held to), got {capacity}")


def check_greedy_pool(method: str, temperature: float, capacity: int, name: str = "capacity",
                      field: str = "") -> None:
    """At temperature 0 (greedy) every trace of a run, and every child branched from one (its temperature
    is the parent's times the multiplier: 0 again), is the same decode: C > 1 spends C times the tokens on
    one answer. ``name``/``field`` as in ``check_deepconf_pool``."""
    if temperature == 0 and capacity > 1:
        fix = "" if method == "deepconf" else f" or {name} 1"  # DeepConf needs two traces at least
        raise ValueError(f"{field}{name} {capacity} at temperature 0 (greedy) are {capacity} copies of one "
                         f"decode (a branched child is its parent's copy too); give temperature > 0{fix}")


def idle_warmup(method: str, warmup: int, max_tokens: int) -> str:
    """Why a Gambit run's tournament can never act ("" when it can): no trace is scored before it is w
    tokens deep, and none grows past max_tokens, so no trace is ever ranked, pruned or branched (the run
    is self-consistency with Gambit's name on it). Said in the run's result, not refused: a served
    request cannot set w (a server setting), and short smoke runs are legitimate."""
    if method != "gambit" or warmup < max_tokens:
        return ""
    return (f"warmup w={warmup} is not below max_tokens {max_tokens}: no trace is scored, so no round "
            f"can prune or branch (the run is self-consistency); raise max_tokens above {warmup} or "
            f"lower the warmup")


def check_batch(method: str, capacity: int, max_num_seqs: int, name: str = "capacity") -> None:
    """Gambit keeps C traces alive at once; where one engine batch holds fewer, the traces beyond it wait
    unscored, every trace that ends frees a slot that Case 1 refills with a child, and the run branched
    on and on (C 8 on 2 slots: 165 traces, 157 of them children, at K 0). A request error: never
    admissible here. SC, STEP and DeepConf traces only wait their turn. The rule and its message are
    ``batch_slots.check``'s (one place: the driver's submit and adopt call it too)."""
    batch_slots.check(method, capacity, max_num_seqs, name)


@dataclass
class SearchConfig:
    """How one problem is searched. Steps are decode steps of the engine; tokens are generated tokens.

    The defaults fit the shipped target's arithmetic traces (~25-110 tokens, a thought every ~10
    tokens); the paper's values (C 256, K 16, Δ 200, w 12K) are the same knobs at a larger scale.
    """

    method: str = "gambit"  # gambit | sc | step | deepconf
    decoding: str = "plain"  # plain | eagle3.1 | pr (speculative decoding of every trace)
    capacity: int = 16  # C: traces in the pool (SC@C, STEP and DeepConf launch C traces)
    swap: int = 4  # K: traces pruned and branched per Case-2 round (0: none; Case 1 still fills)
    interval: int = 8  # Δ: decode steps between tournament rounds (a speculative step counts its mean τ)
    warmup: int = 24  # w, tokens: no scoring before this depth; branching only w tokens after birth
    floor: float = 0.0  # δ: hard floor; a ranked trace scoring (see rank) below it is pruned at a round
    floor_refill: bool = True  # a floor-pruned trace's slot is refilled (zero-sum); False: the pool shrinks
    rank: str = "mean"  # ranking score: mean of the boundary scores (paper) | last | min
    swap_ties: bool = False  # Case 2 may swap a trace for a child of one that only ties it (False: must gain)
    roots: int = 0  # traces launched at the start (0: C); Case 1 branches the rest once they are eligible
    stop_when_decided: bool = False  # end the run once the traces still active cannot change the majority
    # compounds down a lineage (a grandchild gets the multiplier twice), capped at MAX_TEMPERATURE
    child_temperature: float = 1.0  # multiplier on the parent's temperature for a branched child
    kv_ratio: float = 0.9  # r: above this KV use the lowest-ranked resident trace is evicted (gambit, step)
    temperature: float = 0.8  # sampling temperature of root traces
    top_p: float = 1.0  # nucleus sampling mass (1 disables)
    top_k: int = 0  # top-k filter (0 disables)
    max_tokens: int = 256  # tokens per trace (limit)
    max_total_tokens: int = 0  # tokens over the whole run; at it every trace stops (0: no limit)
    max_wall_s: float = 0.0  # seconds of wall time per run; at it every trace stops (0: no limit)
    deepconf_warmup: int = 0  # DeepConf: warm-up traces that set the confidence threshold (0: min(4, C-1))
    deepconf_window: int = 16  # DeepConf: sliding window of token confidences, tokens
    deepconf_keep: float = 90.0  # DeepConf: percent of warm-up traces whose lowest window stays above it
    seed: int = 0  # seeds every trace of the run (with the trace's node id)
    # how a finished trace's answer is read and voted on (gambit.tasks.graded.answer_key)
    answer_rule: str = "boxed"  # boxed | integer | gsm8k | choice | latex

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {DECODINGS}, got {self.decoding!r}")
        for name in ("capacity", "interval", "max_tokens", "deepconf_window"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        for name in ("swap", "warmup", "top_k", "max_total_tokens", "seed", "deepconf_warmup"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if not self.answer_rule:
            raise ValueError(f"answer_rule must be one of {', '.join(ANSWER_KINDS)}, got ''")
        check_answer_rule(self.answer_rule)
        if self.rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {self.rank!r}")
        r = self.roots
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= self.capacity:
            raise ValueError(f"roots must be an integer in [0, capacity], got {self.roots!r}")
        for name in ("floor_refill", "stop_when_decided", "swap_ties"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.method == "gambit" and self.swap > self.capacity:
            hint = "; K defaults to 4: give a pool this small its own swap" if self.swap == 4 else ""
            raise ValueError(f"swap (K={self.swap}) must not exceed capacity (C={self.capacity}){hint}")
        check_deepconf_pool(self.method, self.capacity)
        if self.method == "deepconf" and self.deepconf_warmup >= self.capacity:
            raise ValueError(f"deepconf_warmup must be in [1, capacity) (0: min(4, capacity - 1)), "
                             f"got {self.deepconf_warmup}")

        def finite(name: str, lo: float, hi: float, lo_open: bool = False) -> None:
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v > hi or v < lo \
                    or (lo_open and v == lo):
                raise ValueError(f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}], got {v!r}")

        finite("floor", 0.0, 1.0)
        finite("child_temperature", 0.0, 10.0, lo_open=True)  # a multiplier: its own bound
        finite("kv_ratio", 0.0, 1.0, lo_open=True)
        finite("temperature", 0.0, MAX_TEMPERATURE)
        finite("top_p", 0.0, 1.0, lo_open=True)
        finite("max_wall_s", 0.0, MAX_WALL_S)
        finite("deepconf_keep", 0.0, 100.0, lo_open=True)
        check_greedy_pool(self.method, self.temperature, self.capacity)

    @property
    def idle_warmup(self) -> str:
        return idle_warmup(self.method, self.warmup, self.max_tokens)

    @property
    def deepconf_warm(self) -> int:
        return deepconf_warm(self.capacity, self.deepconf_warmup)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SearchConfig:
        return cls(**d)
