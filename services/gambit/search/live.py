"""Live terminal view of running searches: pool, ghosts, pruned/branched, KV use, votes.

On a TTY the block is redrawn in place with ANSI cursor moves; otherwise (a log, a pipe) it prints
one plain line per update at most every ``min_interval_s`` seconds, so output stays bounded. When a run
ends its block shows how it ended (the traces' ends and the final vote), on a TTY and in a log alike.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter

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


def format_result(r: RunResult) -> list[str]:
    """The block's last state, as many lines as a round's: the last round's block still said "finished
    0, votes —" above the answer when every trace ended between two rounds (`make run`'s problems)."""
    ends = Counter(t["state"] for t in r.traces)
    stopped = f"  stopped {ends['stopped']}" if ends["stopped"] else ""
    why = r.limit or r.error  # which limit, or the error that failed the run
    limit = f" ({why})" if why else ""
    return [f"{r.run_id} [{r.method}] {r.reason}{limit} after round {r.rounds:3d}  {r.wall_s:5.1f}s  "
            f"tokens {r.tokens:6d}",
            f"  ended: finished {ends['finished']} (answered {r.finished_traces}){stopped}  pruned {r.pruned}"
            f"  branched {r.branched}  evicted {r.evicted}",
            f"  votes {vote_counts(r.votes, top=6, empty='—')}"]


def wrapped(lines: list[str], columns: int) -> list[str]:
    """``lines`` cut into rows of fewer than ``columns`` characters (0: as they are). A line wider than
    the terminal wraps there, and the cursor move up by the block's line count then fell short of its
    first row: every redraw left a copy behind (the pool line of C = 16 is ~100 characters)."""
    if columns < 2:
        return lines
    w = columns - 1  # a row of exactly the width wraps on some terminals and not on others
    return [line[i:i + w] for line in lines for i in range(0, max(len(line), 1), w)]


class LiveView:
    def __init__(self, out=None, tty: bool | None = None, min_interval_s: float = 1.0,
                 columns: int | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty() if tty is None else tty
        self.min_interval_s = min_interval_s
        self.columns = columns  # None: the terminal's width at each redraw (it may be resized)
        self._drawn = 0
        self._last = -math.inf  # the first update always prints (monotonic() may be small after boot)
        self.capacity: dict[str, int] = {}

    def _width(self) -> int:
        if self.columns is not None:
            return self.columns
        try:
            return os.get_terminal_size(self.out.fileno()).columns
        except (AttributeError, OSError, ValueError):  # not a terminal after all: no wrapping
            return 0

    def update(self, ev: Progress | RunResult) -> None:
        if isinstance(ev, RunResult):
            self._draw(format_result(ev), final=True)
            self._drawn = 0  # keep the last block on screen; the caller prints the result below
            return
        self._draw(format_progress(ev, self.capacity.get(ev.run_id)))

    def _draw(self, lines: list[str], final: bool = False) -> None:
        if self.tty:
            rows = wrapped(lines, self._width())
            if self._drawn:  # up to the first row of the last block, cleared to the screen's end:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # a shorter block leaves no old rows
            self.out.write("".join(f"\x1b[2K{row}\n" for row in rows))
            self._drawn = len(rows)
        else:
            now = time.monotonic()
            if not final and now - self._last < self.min_interval_s:
                return
            self._last = now
            self.out.write(" | ".join(s.strip() for s in lines) + "\n")
        self.out.flush()
