"""Counters the services export (tokens, steps, batch sizes, KV usage, evictions, preemptions)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0  # tokens fed by prefill (including recompute after preemption)
    shared_prompt_tokens: int = 0  # prompt tokens not prefilled: taken from a leader (add_samples)
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
    spec_drafts: int = 0  # verification forwards of draft trees (one per trace and cycle)
    spec_draft_tokens: int = 0  # draft tokens verified
    spec_accepted: int = 0  # draft tokens accepted and emitted (not those a stop cut after)
    draft_seconds: float = 0.0  # time spent drafting
    spec_capped_steps: int = 0  # steps with speculative traces that decoded plainly (spec.max_batch)
    # decoding ("pr", "eagle3.1", ...; "other": a drafter by path) -> [drafts, draft tokens, accepted]:
    # the spec counters split by method, so a dashboard shows PR's tau beside EAGLE-3.1's on live traffic
    spec_by_decoding: dict = field(default_factory=dict)
    trace_tau: dict = field(default_factory=dict)  # trace id -> tokens per target forward (recent 4096)

    @property
    def tau(self) -> float:
        """Tokens emitted per verification forward: (accepted + drafts) / drafts."""
        return (self.spec_accepted + self.spec_drafts) / self.spec_drafts if self.spec_drafts else 0.0

    @property
    def mean_batch_size(self) -> float:
        return self.batched_traces / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("trace_tau")
        return {**d, "mean_batch_size": self.mean_batch_size, "tau": self.tau}
