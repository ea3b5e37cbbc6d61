"""Batch slots: which held run may launch beside the launched runs' pools.

A Gambit run keeps C traces alive at once, so it launches only when its C fits in the engine's batch
(``max_num_seqs``) beside the launched runs' pools; until then it is held (first come, first served;
``fits``). Launched beside pools that overfill the batch, its traces waited unscored behind the others'
while each slot one of its traces freed went to a child (Case 1): three runs of C 4 on 8 slots branched
3 and 1 times at K 0 where alone they branched none. A held run's clock (``max_wall_s``, its elapsed and
``wall_s``) counts from its submit, as a client's deadline does: one whose time passes while held ends
"limit" with no trace launched, one launched late has only the rest. Runs taken over (``adopt``,
``recover``) are held the same way, in the order adopted.

The rule is defined here once: which methods need their C free (``needs_free_slots``), the slots a run
holds (``slots``), and the refusal of a C that never fits (``check``; ``config.check_batch`` is its
message, for the callers that know only the method and C: the Target, ``gambit run``); the router ranks
replicas by the same ``slots`` (``serving.kv_balance``). Pure functions; the driver's admission
(``search.admission``: ``_fits``, ``_admit``, ``_expire_held``) owns the held queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gambit.search.run_state import SearchRun


class OverBatch(ValueError):
    """A Gambit run whose C is above the engine's batch: it never fits (a request error)."""


def needs_free_slots(method: str) -> bool:
    """Whether a run of ``method`` launches only with its C free in the batch: Gambit keeps C traces alive,
    and one that waits is never scored while the slots its running traces free go to their children
    (Case 1). SC, STEP and DeepConf traces only wait their turn."""
    return method == "gambit"


def slots(capacity: int, seqs: int) -> int:
    """Batch slots a run of C ``capacity`` holds on a batch of ``seqs``: at most the whole batch."""
    return min(capacity, seqs)


def check(method: str, capacity: int, seqs: int | None, name: str = "capacity") -> None:
    """Refuse (``OverBatch``) a run that would never fit, even alone; ``seqs`` None: the engine does
    not say its batch, nothing to check."""
    if seqs is not None and needs_free_slots(method) and capacity > seqs:
        raise OverBatch(f"{name} {capacity}: Gambit keeps as many traces alive at once, more than one "
                        f"engine batch holds (max_num_seqs {seqs}); lower it, or use method sc")


def max_seqs(engine) -> int | None:
    """The engine's batch (``max_num_seqs``); None for an engine that does not say."""
    seqs = getattr(getattr(engine, "config", None), "max_num_seqs", None)
    return seqs if isinstance(seqs, int) else None


def fits(run: SearchRun, launched: list[SearchRun], seqs: int | None) -> bool:
    """Whether ``run`` may launch now beside the ``launched`` runs on a batch of ``seqs``. Each launched
    run holds its C slots of the batch (its pool: at most C traces alive at once). A Gambit run needs its
    C free: a trace of it that waits is never scored while the slots its running traces free go to their
    children. Others only wait their turn, so they launch past the batch unless a Gambit run is in it.
    Nothing launched (or a batch the engine does not say): any run."""
    if seqs is None or not launched:
        return True
    used = sum(slots(r.cfg.capacity, seqs) for r in launched)
    if used + slots(run.cfg.capacity, seqs) <= seqs:
        return True
    return not needs_free_slots(run.cfg.method) and not any(needs_free_slots(r.cfg.method) for r in launched)


def out_of_time(held: Iterable[SearchRun]) -> list[SearchRun]:
    """The held runs whose ``max_wall_s`` passed while they waited (their clock runs from the submit)."""
    return [r for r in held if r.out_of_time()]


def queued_limit(run: SearchRun) -> str:
    """The limit a run that timed out held reports: it says it never left the queue."""
    return f"max_wall_s {run.cfg.max_wall_s:g} (timed out queued for batch slots)"
