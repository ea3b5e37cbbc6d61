"""Counters the services export (tokens, steps, batch sizes, KV usage, evictions, preemptions)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # tokens fed by prefill (including recompute after preemption)
    generated_tokens: int = 0
    batched_traces: int = 0  # sum over steps of traces in the batch
    last_batch_size: int = 0
    max_batch_size: int = 0
    forks: int = 0
    aborts: int = 0
    finished: int = 0
    evictions: int = 0
    preemptions: int = 0
    kv_usage: float = 0.0
    forward_seconds: float = 0.0

    @property
    def mean_batch_size(self) -> float:
        return self.batched_traces / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "mean_batch_size": self.mean_batch_size}
