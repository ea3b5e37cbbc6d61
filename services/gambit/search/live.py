"""Live terminal view of running searches: pool, ghosts, pruned/branched, KV use, votes.

On a TTY the block is redrawn in place with ANSI cursor moves; otherwise (a log, a pipe) it prints
one plain line per update at most every ``min_interval_s`` seconds, so output stays bounded.
"""

from __future__ import annotations

import math
import sys
import time

from gambit.search.results import Progress, RunResult
from gambit.search.vote import vote_counts


def bar(frac: float, width: int = 20) -> str:
    n = max(0, min(width, round(frac * width)))
    return "[" + "#" * n + "." * (width - n) + "]"


def format_progress(p: Progress, capacity: int | None = None) -> list[str]:
    pool = "●" * p.resident + "○" * p.ghosts
    if capacity:
        pool += "·" * max(0, capacity - p.active)
    votes = vote_counts(p.votes, top=6, empty="—")
    return [f"{p.run_id} [{p.method}] step {p.step:4d} round {p.round:3d}  {p.wall_s:5.1f}s  "
            f"tokens {p.tokens:6d}  KV {bar(p.kv_usage)} {100 * p.kv_usage:3.0f}%",
            f"  pool {pool}  active {p.active} (resident {p.resident}, ghost {p.ghosts})  "
            f"pruned {p.pruned}  branched {p.branched}  evicted {p.evicted}  finished {p.finished}",
            f"  votes {votes}"]


class LiveView:
    def __init__(self, out=None, tty: bool | None = None, min_interval_s: float = 1.0) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.min_interval_s = min_interval_s
        self._drawn = 0
        self._last = -math.inf  # the first update always prints (monotonic() may be small after boot)
        self.capacity: dict[str, int] = {}

    def update(self, ev: Progress | RunResult) -> None:
        if isinstance(ev, RunResult):
            self._drawn = 0  # keep the last block on screen; the caller prints the result below
            return
        lines = format_progress(ev, self.capacity.get(ev.run_id))
        if self.tty:
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F")  # up to the first line of the last block
            self.out.write("".join(f"\x1b[2K{line}\n" for line in lines))
            self._drawn = len(lines)
        else:
            now = time.monotonic()
            if now - self._last < self.min_interval_s:
                return
            self._last = now
            self.out.write(" | ".join(s.strip() for s in lines) + "\n")
        self.out.flush()
