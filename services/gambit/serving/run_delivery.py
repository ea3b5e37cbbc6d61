"""Where a run's outputs go from the engine thread: its record (progress at most twice a second, the
result once, saying what the scorer and the run's settings did), then its sink, once that write was
tried (``records.after``: GetRun sees the result, and a takeover resumes at or past the round sent)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from gambit.search.config import idle_warmup
from gambit.serving.solve_config import SolveConfig

log = logging.getLogger("gambit.serving.target_service")  # its messages were the service's: same logger

PROGRESS_EVERY_S = 0.5  # a run's progress is written to its record at most this often (the last: at its end)


class RunDelivery:
    """The per-run bookkeeping of deliveries for one ``TargetService``; ``scorer``: its ``fallbacks`` and
    ``unguided`` are read into each result. Each call is given the service's record writer
    (``record_writer``) and replica id as they are then (a tool may swap them: ``tools/serve_parts_ab``)."""

    def __init__(self, scorer) -> None:
        self.scorer = scorer
        self.marks: dict[str, int] = {}  # run id -> scorer fallbacks when it started
        self.notes: dict[str, str] = {}  # run id -> what its result says of its settings (``idle_warmup``)
        self.written: dict[str, float] = {}  # run id -> last progress write to the run record
        self.unwritten: dict[str, dict] = {}  # run id -> its latest progress not written (throttled)

    def admitted(self, run_id: str, cfg: SolveConfig) -> None:
        self.marks[run_id] = getattr(self.scorer, "fallbacks", 0)
        note = idle_warmup(cfg.method, cfg.warmup, cfg.max_tokens)  # ran, and the result says why idle
        if note:
            self.notes[run_id] = note

    def result(self, d: dict, sink: Callable | None, records, replica: str) -> None:
        rid = d["run_id"]
        d["scorer_fallbacks"] = getattr(self.scorer, "fallbacks", 0) - self.marks.pop(rid, 0)
        # a Scorer of another width (every call fell back): a backend reads it in the Result
        why = getattr(self.scorer, "unguided", "") if d["scorer_fallbacks"] else ""
        note = self.notes.pop(rid, "")  # said when it ran its course as self-consistency
        ran = d["status"] in ("done", "limit")
        said = [m for m in (d.get("message"), why, note if ran else "") if m]
        if said:
            d["message"] = "; ".join(said)
        self.written.pop(rid, None)
        last = self.unwritten.pop(rid, None)  # GetRun's last_progress: the run's last round
        records.put_held(rid, status=d["status"], result=d, replica=replica,
                         **({"progress": last} if last is not None else {}))
        if sink is not None:  # once its records are written: GetRun then sees the result
            records.after(functools.partial(_send, sink, d))

    def progress(self, d: dict, sink: Callable | None, records, replica: str) -> None:
        rid = d["run_id"]
        if time.monotonic() - self.written.get(rid, 0.0) > PROGRESS_EVERY_S:
            self.written[rid] = time.monotonic()  # at most two progress writes a second per run
            self.unwritten.pop(rid, None)
            records.put_held(rid, status="running", progress=d, replica=replica)
        else:
            self.unwritten[rid] = d
        if sink is not None:  # once its round's tree write was tried: a takeover resumes at or past it
            records.after(functools.partial(_send, sink, d))


def _send(sink: Callable, d: dict) -> None:
    try:
        sink(d)
    except Exception:  # noqa: BLE001 — a gone consumer must not stop the loop
        log.exception("run sink failed")
