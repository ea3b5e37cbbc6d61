"""Trace state and sampling parameters."""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    """Per-trace sampling. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # a string or a list of strings (None: none); held as a tuple
    ignore_eos: bool = False
    logprobs: int = 0  # return this many top log-probabilities per token (DeepConf uses 20)
    decoding: str = "plain"  # "plain" | "eagle3.1" | "pr" (shipped drafters) | a drafter folder path

    def __post_init__(self) -> None:
        self.temperature = check_temperature(self.temperature)
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):  # a str compared raised a bare TypeError
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or not 0 <= self.top_k <= MAX_SEED:  # a C++ int64 as well
            raise ValueError(f"top_k must be an integer in [0, 2**63), got {self.top_k!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not is_int(self.logprobs) or not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be an integer in [0, 20], got {self.logprobs!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        check_seed(self.seed)
        if not isinstance(self.decoding, str) or not self.decoding:
            raise ValueError(f"decoding must be 'plain', 'eagle3.1', 'pr' or a drafter folder, "
                             f"got {self.decoding!r}")
        self.stop = check_stop(self.stop)

    def child(self, seed: int | None, temperature: float) -> SamplingParams:
        """A copy with a new seed and temperature, those two checked (``dataclasses.replace`` would
        re-run every check of fields already checked: a fifth of a fork's cost)."""
        check_seed(seed)
        temperature = check_temperature(temperature)
        out = object.__new__(SamplingParams)  # a shallow copy (every field is immutable)
        out.__dict__.update(self.__dict__)
        out.seed, out.temperature = seed, temperature
        return out


def is_int(v) -> bool:
    """An integer that is not a bool (True would pass as 1)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """A real number (numpy's too) that is not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_stop(stop) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings. One string is one stop string, as in OpenAI's API and
    vLLM (``tuple("boxed")`` made it five one-letter stops); None is none."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    elif not isinstance(stop, (list, tuple)):
        raise ValueError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    if any(not isinstance(s, str) or not s for s in stop):
        raise ValueError(f"stop must hold non-empty strings, got {list(stop)!r}")
    return tuple(stop)


def check_temperature(t) -> float:
    """``t`` as a float: a finite real >= 0. A bool passed (True sampled at temperature 1, as top_p
    and top_k already refuse it); numpy's float32 was refused as "not a number" (top_p takes it)."""
    if not (is_number(t) and math.isfinite(t)) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
    return float(t)


MAX_SEED = 2**63 - 1  # the samplers take a signed 64-bit seed: 2**63 failed in the step, after the add


def check_seed(seed) -> None:
    if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):  # bool is no seed
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")


class TraceStatus(enum.Enum):
    WAITING = "waiting"  # needs (re)prefill before it can decode
    RUNNING = "running"  # holds KV blocks for its cached tokens
    FINISHED = "finished"
    EVICTED = "evicted"  # dropped under memory pressure; holds nothing, never requeued by itself


@dataclass
class Trace:
    id: int
    token_ids: list[int]
    prompt_len: int
    params: SamplingParams
    seed: int
    priority: float = 0.0
    arrival: int = 0
    parent: int | None = None
    status: TraceStatus = TraceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0  # leading tokens whose KV is in the cache
    finish_reason: str | None = None
    logprobs: list[float] = field(default_factory=list)  # generated tokens' log-probs (params.logprobs > 0)
    draft: Any = None  # speculative decoding state (gambit.speculative.draft_state.DraftState)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def is_done(self) -> bool:
        return self.status in (TraceStatus.FINISHED, TraceStatus.EVICTED)
