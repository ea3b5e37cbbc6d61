"""Scheduler-view eviction: above a run's KV ratio r, its lowest-ranked resident trace goes first.

Only Gambit and STEP runs evict under r. Pure functions over the driver's runs and engine; the driver
(``SearchDriver._kv_evict``) scores and settles first, then aborts the trace ``lowest_resident`` picks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gambit.search.run_state import SearchRun
    from gambit.search.tree import Node

EVICTING = ("gambit", "step")  # the methods whose runs evict above their KV ratio r


def over_ratio(runs: Iterable[SearchRun], usage: float) -> list[SearchRun]:
    """The runs that evict under their r (Gambit, STEP) whose r is below the KV ``usage``."""
    return [r for r in runs if r.cfg.method in EVICTING and usage > r.cfg.kv_ratio]


def evict_ratio(launched: Iterable[SearchRun]) -> float:
    """The lowest KV ratio r of the ``launched`` runs that evict under it (inf: none): above it the
    KV-ratio check may evict this step. Held runs are not passed: they hold no KV."""
    scored = [r.cfg.kv_ratio for r in launched if r.cfg.method in EVICTING]
    return min(scored, default=float("inf"))


def lowest_resident(launched: Iterable[SearchRun], usage: float) -> tuple[SearchRun, Node] | None:
    """The lowest-ranked resident trace (by its run's rank rule; ties: the newest) of the ``launched``
    runs over their r at ``usage``, among runs with two resident traces at least; None if there is none.
    Held runs are not passed: they have no KV (a restored one's nodes say running, with no trace)."""
    worst: tuple[float, SearchRun, Node] | None = None
    for run in over_ratio(launched, usage):
        resident = [n for n in run.nodes.values() if n.resident]
        if len(resident) < 2:
            continue
        rule = run.cfg.rank
        n = min(resident, key=lambda x: (x.rank_score(rule), -x.id))
        if worst is None or n.rank_score(rule) < worst[0]:
            worst = (n.rank_score(rule), run, n)
    return None if worst is None else (worst[1], worst[2])


def engine_may_evict(engine) -> bool:
    """Whether the engine's next step may run out of blocks, and so evict by priority: its running
    traces need more blocks for their tokens not yet cached than are free. Only its scheduler
    evicts (a speculative draft that finds no block decodes plainly), and nothing runs between
    here and that step but a caller's submit (queued, never evicting) or cancel (freeing)."""
    blocks = getattr(engine, "blocks", None)
    running = getattr(getattr(engine, "scheduler", None), "running", None)
    if blocks is None or running is None:  # another engine: assume it may
        return True
    free, need = blocks.num_free, 0
    for t in running.values():
        need += blocks.extra_blocks(t, len(t.token_ids))
        if need > free:
            return True
    return False
