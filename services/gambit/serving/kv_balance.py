"""Which Target replica takes a new run: the one whose KV can hold it with the most room left.

A run reserves its worst case on admission (C traces × (prompt + max_tokens) tokens, in KV blocks;
``TargetService.blocks_needed``), so a replica's load is its free KV blocks, not only its run count.
Each replica reports ``num_blocks``, ``reserved_blocks``, ``runs``, ``block_size``,
``max_model_len``, ``max_num_seqs`` and ``batch_slots`` (``Target.record_routing_stats``); the router
(``gambit.deployments.kv_router``) estimates a run's need from the request (prompt tokens ≤ UTF-8 bytes
+ BOS: an upper bound for the character-level and byte-level tokenizers) and ranks the replicas here.
The Target still checks the exact need and refuses with RESOURCE_EXHAUSTED; the Coordinator then
retries on the replicas that have not refused yet, so a run is refused only when no replica can hold it.

Batch slots: a Target launches a Gambit run only when its C fits in the engine batch beside the runs
there, held runs served first (``SearchDriver._fits``); until then it holds it, queued, KV reserved. Of
the replicas whose KV can hold a run, those where it launches now come first (stop 67: ranked by KV
alone, a run went to a replica whose batch was full and waited there while another had free slots).

A replica that reports ``stuck`` (its engine wedged in one step, or its thread dead: ``Target.check_health``
fails until Serve replaces it) refuses every run (UNAVAILABLE): it is ranked after all the others (stop 69:
ranked by its KV, a wedged replica with free blocks came first, and every run paid a refusal there).
"""

from __future__ import annotations

from dataclasses import dataclass

from gambit.search.batch_slots import slots


@dataclass(frozen=True)
class ReplicaLoad:
    replica: str
    num_blocks: int  # KV blocks of its engine
    reserved_blocks: int  # worst-case blocks of the runs it holds (and runs routed to it since)
    runs: int  # runs in flight there
    block_size: int = 16  # tokens per KV block
    max_model_len: int = 2048  # tokens per trace at most
    max_num_seqs: int = 0  # slots of its engine batch; 0: not reported (a replica before stop 67)
    batch_slots: int = 0  # slots its launched and held runs take: min(C, max_num_seqs) each
    stuck: bool = False  # it cannot serve now (engine wedged or dead): it refuses every run

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1 or self.max_model_len < 1:
            raise ValueError(f"{self.replica}: num_blocks, block_size and max_model_len must be >= 1")
        if self.reserved_blocks < 0 or self.runs < 0 or self.max_num_seqs < 0 or self.batch_slots < 0:
            raise ValueError(f"{self.replica}: reserved_blocks, runs, max_num_seqs and batch_slots "
                             "must be >= 0")

    @property
    def free_blocks(self) -> int:
        return max(0, self.num_blocks - self.reserved_blocks)

    def slots(self, capacity: int) -> int:
        """Batch slots a run of C ``capacity`` takes here (0: the replica does not report its batch)."""
        return slots(capacity, self.max_num_seqs)  # the driver's count (``batch_slots.slots``)

    def launches(self, capacity: int) -> bool:
        """Whether a run of C ``capacity`` would launch at once here, not be held for batch slots: its C
        fits beside the launched and held runs' (a held run means none is left: it did not fit). True
        where the batch is not reported (ranked as before)."""
        if self.max_num_seqs < 1 or capacity < 1:
            return True
        return self.batch_slots + self.slots(capacity) <= self.max_num_seqs

    @classmethod
    def from_stats(cls, replica: str, stats: dict) -> ReplicaLoad | None:
        """From a replica's routing stats; None when it has not reported yet (or reported garbage)."""
        try:
            return cls(replica, int(stats["num_blocks"]), int(stats["reserved_blocks"]), int(stats["runs"]),
                       int(stats.get("block_size", 16)), int(stats.get("max_model_len", 2048)),
                       int(stats.get("max_num_seqs", 0)), int(stats.get("batch_slots", 0)),
                       stats.get("stuck") is True)
        except (KeyError, TypeError, ValueError):
            return None


def estimate_need(problem: str, capacity: int, max_tokens: int, load: ReplicaLoad) -> int:
    """Upper bound of the KV blocks a run reserves on ``load``'s replica."""
    prompt = len(problem.encode("utf-8", "surrogatepass")) + 1  # a lone surrogate (JSON "\\ud800"): 3 bytes
    per_trace = -(-min(prompt + max_tokens, load.max_model_len) // load.block_size)
    return capacity * per_trace


def rank(loads: list[ReplicaLoad], need: dict[str, int], unknown: list[str] = (),
         avoid: tuple[str, ...] = (), capacity: int = 0) -> list[list[str]]:
    """Replica ids in the order to try, one per rank: those that can hold the run (``need``: its
    blocks per replica), the most free KV left after it first (as a fraction, then fewer runs), those
    where it launches at once (``capacity``: its C, ``ReplicaLoad.launches``; 0: not checked) before
    those that would hold it for batch slots, the replicas that have not reported (as a rule just
    started: empty) between the two; then those that cannot hold it, most free blocks first (they
    refuse, and the Coordinator moves on); then the ``stuck`` ones (they refuse any run). ``avoid``:
    replicas that refused it; they come last, and only when nothing else is left."""
    live = [x for x in loads if x.replica not in avoid and not x.stuck]
    fits = [x for x in live if x.free_blocks >= need[x.replica]]
    fits.sort(key=lambda x: (-(x.free_blocks - need[x.replica]) / x.num_blocks, x.runs, x.replica))
    full = [x for x in live if x.free_blocks < need[x.replica]]
    full.sort(key=lambda x: (-x.free_blocks, x.runs, x.replica))
    order = [x.replica for x in fits if x.launches(capacity)] + sorted(r for r in unknown if r not in avoid)
    order += [x.replica for x in fits if not x.launches(capacity)] + [x.replica for x in full]
    order += sorted(x.replica for x in loads if x.replica not in avoid and x.stuck)
    if not order:  # every replica refused: let one answer again (its refusal ends the run's tries)
        order = sorted([x.replica for x in loads] + list(unknown))
    return [[r] for r in order]
