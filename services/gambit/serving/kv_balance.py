"""Which Target replica takes a new run: the one whose KV can hold it with the most room left.

A run reserves its worst case on admission (C traces × (prompt + max_tokens) tokens, in KV blocks;
``TargetService.blocks_needed``), so a replica's load is its free KV blocks, not only its run count.
Each replica reports ``num_blocks``, ``reserved_blocks``, ``runs``, ``block_size`` and
``max_model_len`` (``Target.record_routing_stats``); the router (``gambit.deployments.kv_router``)
estimates a run's need from the request (prompt tokens ≤ UTF-8 bytes + BOS: an upper bound for the
character-level and byte-level tokenizers) and ranks the replicas here. The Target still checks the
exact need and refuses with RESOURCE_EXHAUSTED; the Coordinator then retries on the replicas that
have not refused yet, so a run is refused only when no replica can hold it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    num_blocks: int  # KV blocks of its engine
    reserved_blocks: int  # worst-case blocks of the runs it holds (and runs routed to it since)
    runs: int  # runs in flight there
    block_size: int = 16  # tokens per KV block
    max_model_len: int = 2048  # tokens per trace at most

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1 or self.max_model_len < 1:
            raise ValueError(f"{self.replica}: num_blocks, block_size and max_model_len must be >= 1")
        if self.reserved_blocks < 0 or self.runs < 0:
            raise ValueError(f"{self.replica}: reserved_blocks and runs must be >= 0")

    @property
    def free_blocks(self) -> int:
        return max(0, self.num_blocks - self.reserved_blocks)

    @classmethod
    def from_stats(cls, replica: str, stats: dict) -> ReplicaLoad | None:
        """From a replica's routing stats; None when it has not reported yet (or reported garbage)."""
        try:
            return cls(replica, int(stats["num_blocks"]), int(stats["reserved_blocks"]), int(stats["runs"]),
                       int(stats.get("block_size", 16)), int(stats.get("max_model_len", 2048)))
        except (KeyError, TypeError, ValueError):
            return None


def estimate_need(problem: str, capacity: int, max_tokens: int, load: ReplicaLoad) -> int:
    """Upper bound of the KV blocks a run reserves on ``load``'s replica."""
    prompt = len(problem.encode()) + 1
    per_trace = -(-min(prompt + max_tokens, load.max_model_len) // load.block_size)
    return capacity * per_trace


def rank(loads: list[ReplicaLoad], need: dict[str, int], unknown: list[str] = (),
         avoid: tuple[str, ...] = ()) -> list[list[str]]:
    """Replica ids in the order to try, one per rank: those that can hold the run (``need``: its
    blocks per replica), the most free KV left after it first (as a fraction, then fewer runs); then
    the replicas that have not reported; then those that cannot hold it, most free blocks first
    (they refuse, and the Coordinator moves on). ``avoid``: replicas that refused it; they come
    last, and only when nothing else is left."""
    fits = [x for x in loads if x.replica not in avoid and x.free_blocks >= need[x.replica]]
    fits.sort(key=lambda x: (-(x.free_blocks - need[x.replica]) / x.num_blocks, x.runs, x.replica))
    full = [x for x in loads if x.replica not in avoid and x.free_blocks < need[x.replica]]
    full.sort(key=lambda x: (-x.free_blocks, x.runs, x.replica))
    order = [x.replica for x in fits] + sorted(r for r in unknown if r not in avoid)
    order += [x.replica for x in full]
    if not order:  # every replica refused: let one answer again (its refusal ends the run's tries)
        order = sorted([x.replica for x in loads] + list(unknown))
    return [[r] for r in order]
