"""The live view as a terminal shows it: redrawn in place at any width (a line wider than the terminal
wraps there, and the old view left a copy of the block behind at every redraw), and ending on the run's
final state (the last round's block said "finished 0, votes —" above the answer)."""

from __future__ import annotations

import io
import os
import re

import pytest

from gambit.search.live import LiveView, format_result, wrapped
from gambit.search.results import Progress, RunResult

ESC = re.compile(r"\x1b\[(\d*)([A-Za-z])")


def screen(text: str, width: int) -> list[str]:
    """What a terminal of ``width`` columns shows after ``text``: autowrap at the width (deferred, as
    xterm does), newline, and the three sequences the view writes (cursor n lines up to column 0,
    clear to the screen's end, clear the line)."""
    rows, r, c = [""], 0, 0

    def put(ch: str) -> None:
        nonlocal r, c
        if c == width:  # the previous character filled the row: this one goes on the next
            r, c = r + 1, 0
        while len(rows) <= r:
            rows.append("")
        row = rows[r].ljust(c)
        rows[r] = row[:c] + ch + row[c + 1:]
        c += 1

    i = 0
    while i < len(text):
        m = ESC.match(text, i)
        if m:
            n, op = int(m[1] or 1), m[2]
            if op == "F":
                r, c = max(0, r - n), 0
            elif op == "J":
                del rows[r + 1:]
                rows[r] = rows[r][:c]
            elif op == "K":
                rows[r] = ""
            i = m.end()
            continue
        if text[i] == "\n":
            r, c = r + 1, 0
            while len(rows) <= r:
                rows.append("")
        else:
            put(text[i])
        i += 1
    return [row.rstrip() for row in rows if row.strip()]


def progress(step: int, finished: int = 0, votes: dict | None = None) -> Progress:
    return Progress("p1", "gambit", step // 8, step, 16, 0, 16, 4, 4, 0, finished, 16 * step, 0.42,
                    votes or {}, step / 10)


def result() -> RunResult:
    traces = [{"state": "finished"}] * 16 + [{"state": "pruned"}] * 9
    return RunResult("p1", "gambit", "614", "614", "614", "majority", {"614": 16}, {"614": 9.0}, traces,
                     1472, 16, 11, 9, 9, 0, 3.2, {}, "done")


class Tty(io.StringIO):
    def fileno(self) -> int:
        return 1


@pytest.mark.parametrize("width", [80, 60, 200])
def test_redraws_leave_one_block_at_any_terminal_width(monkeypatch, width):
    """At 80 columns the pool line of C = 16 (~100 characters) takes two rows; the view moved up three,
    so each redraw kept one row of the block before it."""
    monkeypatch.setattr(os, "get_terminal_size", lambda fd=1: os.terminal_size((width, 24)))
    out = Tty()
    view = LiveView(out, tty=True)
    view.capacity["p1"] = 16
    for step in (8, 16, 24, 32):
        view.update(progress(step))
    shown = screen(out.getvalue(), width)
    assert sum(row.startswith("p1 [gambit] step") for row in shown) == 1, shown
    assert shown[0].startswith("p1 [gambit] step   32") and all(len(row) < width for row in shown)
    assert "".join(shown).count("pool ●") == 1


def test_the_block_ends_on_the_runs_final_state_on_a_tty():
    out = Tty()
    view = LiveView(out, tty=True, columns=200)
    view.update(progress(88))  # the last round: no trace had finished yet
    view.update(result())  # every trace ended between that round and the end
    out.write(">>> answer 614\n")
    shown = screen(out.getvalue(), 200)
    assert shown == [
        "p1 [gambit] done after round  11    3.2s  tokens   1472",
        "  ended: finished 16 (answered 16)  pruned 9  branched 9  evicted 0",
        "  votes 614 ×16",
        ">>> answer 614"]


def test_a_log_gets_the_final_state_even_within_the_interval():
    out = io.StringIO()
    view = LiveView(out, tty=False, min_interval_s=3600)
    view.update(progress(8))
    view.update(progress(88))  # rate-limited
    view.update(result())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in out.getvalue()
    assert lines[1] == ("p1 [gambit] done after round  11    3.2s  tokens   1472 | ended: finished 16 "
                        "(answered 16)  pruned 9  branched 9  evicted 0 | votes 614 ×16")


def test_a_limit_and_stopped_traces_are_named():
    r = result()
    r.reason, r.limit = "limit", "max_wall_s 25"
    r.traces = [{"state": "stopped"}] * 3 + [{"state": "finished"}]
    r.votes, r.finished_traces = {}, 0
    assert format_result(r) == [
        "p1 [gambit] limit (max_wall_s 25) after round  11    3.2s  tokens   1472",
        "  ended: finished 1 (answered 0)  stopped 3  pruned 9  branched 9  evicted 0",
        "  votes —"]


def test_wrapped_cuts_rows_below_the_width():
    assert wrapped(["abcdef", ""], 4) == ["abc", "def", ""]
    assert wrapped(["abcdef"], 0) == ["abcdef"]  # no terminal width known: as they are
