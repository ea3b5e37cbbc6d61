"""The driver's guidance sync: batched scorer calls, Gambit's boundaries held until its rounds, and
the scores of a remote scorer applied when a round or a vote needs them (``SearchDriver`` mixes it in).

A row is ``(key, state, features, run, node)``: one boundary to score.
"""

from __future__ import annotations

import time

import torch

from gambit.scoring.confidence import with_confidence


class Guidance:
    """Needs ``scorer``, ``pending``, ``deferred`` and ``score_calls`` on the instance."""

    def _score(self, rows: list[tuple]) -> None:
        """One batched scorer call for ``rows`` (in order, so each trace's rows stay in order)."""
        if not rows:
            return
        x = torch.stack([r[1] for r in rows])
        if rows[0][2] is not None:  # every run of a driver shares its scorer: all or none have them
            x = with_confidence(x, torch.tensor([r[2] for r in rows]))
        keys, who = [r[0] for r in rows], [(r[3], r[4]) for r in rows]
        self.score_calls += 1
        if hasattr(self.scorer, "score_async"):  # a remote scorer: the call overlaps the next steps
            self.pending.append((who, self.scorer.score_async(keys, x)))
            return
        self._apply(who, self.scorer.score(keys, x))
        for key, _, _, _, node in rows:
            if not node.resident:  # ended in the meantime: the scorer forgets it again
                self.scorer.drop(key)

    def _score_now(self, rows: list[tuple]) -> None:
        """``_score`` and, for a remote scorer, wait for the scores: what reads them comes next."""
        self._score(rows)
        if self.pending:
            self._settle()

    def _defer(self, rows: list[tuple], runs: list) -> list[tuple]:
        """Gambit's guidance sync happens at its rounds: a Gambit run's boundaries wait (in order)
        until a round of any run of this driver is due, then go in one scorer call with the step's
        other rows (STEP's are scored every step: its eviction reads them). Returns the rows to score
        now. A remote scorer too: sending each step's few rows as they came (overlapping decoding)
        made ~6x the calls, and on a 2-core Target their CPU (request building, the scorer-client
        thread, the Scorer replica) took cores from the engine's OpenMP threads: one run 7% slower
        end to end than waiting once per round for one larger call (``tools/serve_parts_ab.py``)."""
        if any(r.cfg.method == "gambit" and r.round_this_step() for r in runs):
            return self._take_deferred() + rows
        now = []
        for r in rows:
            (self.deferred if r[3].cfg.method == "gambit" else now).append(r)
        return now

    def _take_deferred(self, run=None) -> list[tuple]:
        if run is None:
            out, self.deferred = self.deferred, []
            return out
        out = [r for r in self.deferred if r[3] is run]
        self.deferred = [r for r in self.deferred if r[3] is not run]
        return out

    @staticmethod
    def _apply(who, scores) -> None:
        for (run, node), s in zip(who, scores.tolist(), strict=True):
            run.on_scores(node, [s])

    def _settle(self, due: set[str] | None = None) -> float:
        """Apply the scores still in flight (``score_async``); returns the seconds spent waiting.

        ``due``: only the runs that need their scores now (a round or a vote). Calls are applied in
        the order they were made, up to the last one holding a boundary of a due run, so each trace
        gets its scores in order and other runs' calls keep overlapping decoding: with many runs
        whose rounds fall on different steps, settling everything would wait on nearly every step.
        """
        n = len(self.pending)
        if due is not None:
            n = max((i + 1 for i, (who, _) in enumerate(self.pending)
                     if any(run.run_id in due for run, _ in who)), default=0)
        t = time.perf_counter()
        for _ in range(n):  # each call leaves ``pending`` as it is applied: one that raises (the scorer
            who, fut = self.pending.pop(0)  # failed) does not apply the calls before it a second time
            self._apply(who, fut.result())
        return time.perf_counter() - t
