"""A run's end: the vote over its finished traces (the method's rule), its solution, its grade
(``SearchRun`` mixes it in).
"""

from __future__ import annotations

import time

from gambit.search import tree as T
from gambit.search.deepconf import vote_weights
from gambit.search.results import RunResult
from gambit.search.tree import Node
from gambit.search.vote import majority_vote, weighted_vote
from gambit.tasks.graded import latex_right


class RunVote:
    """Needs the run's ``cfg``, ``nodes``, ``active``, counters, ``timings``, ``engine`` and ``gold``."""

    def finish(self, reason: str) -> RunResult:
        for i in sorted(self.active):
            n = self.nodes[i]
            if n.state == T.GHOST:  # still a ghost when the pool ran out: it never got an answer
                n.state, n.end_reason, n.end_step = T.PRUNED, "ghost", self.step
                self.active.discard(i)
                self.dirty.add(n.id)
                if self.scorer is not None:  # its history goes too (a served scorer kept every run's last
                    self.scorer.drop(self.key(i))  # ghosts, and the client its running means, for good)
        # in creation order: a majority tie goes to the oldest trace's answer (a root before its children).
        # Tried at stop 63: ties by total score (dev +0.5 / -0.3 points at C = 16 / 8, test -0.5 / -0.5)
        # and by finishing order (test: SC@4 and SC@8 two problems fewer each): kept
        fin = [n for n in self.nodes.values() if n.state == T.FINISHED]
        answers = [n.answer for n in fin]
        if self.cfg.method == "deepconf":
            weights, rule = vote_weights([n.conf_min for n in fin], self.threshold), "confidence-weighted"
        else:
            weights = [n.rank_score(self.cfg.rank) for n in fin]
            rule = "score-weighted" if self.cfg.method == "step" else "majority"
        votes, wvotes = {}, {}
        for a, w in zip(answers, weights, strict=True):
            if a is not None:
                votes[a] = votes.get(a, 0) + 1
                wvotes[a] = wvotes.get(a, 0.0) + w
        maj = majority_vote(answers)
        # no finished trace has a weight (sc: no scores; or none scored): the weighted answer is the
        # majority's, its votes all 0 (the contract; the bench tables' "weighted" column reads it so)
        wv = weighted_vote(answers, weights) if sum(weights) > 0 else maj
        answer = maj if rule == "majority" else wv
        traces = [{"id": n.id, "parent": n.parent, "state": n.state, "answer": n.answer,
                   "tokens": n.depth, "own_tokens": n.own_tokens, "score": n.mean_score,
                   "birth_step": n.birth_step, "end_step": n.end_step, "end_reason": n.end_reason}
                  for n in self.nodes.values()]
        # the run's solution: the best-ranked finished trace that gave the answer (its vote weight, then
        # the earliest), decoded once here
        best = max(((w, -n.id, n) for n, w in zip(fin, weights, strict=True)
                    if answer is not None and n.answer == answer), default=None, key=lambda x: x[:2])
        self.result = RunResult(
            self.run_id, self.cfg.method, answer, maj, wv, rule, votes, wvotes, traces, self.tokens,
            sum(n.answer is not None for n in fin), self.round, self.pruned, self.branched, self.evicted,
            time.perf_counter() - self.t0, dict(self.timings), reason,
            None if self.gold is None else self.graded(answer, fin), self.threshold, len(self.prompt_ids),
            "" if best is None else self.engine.tokenizer.decode(best[2].tokens),
            None if best is None else best[2].id, self.limit_hit)
        return self.result

    def graded(self, answer: str | None, fin: list[Node]) -> bool:
        """Whether the voted answer is the gold, as ``gambit eval`` grades its vote: the key, or under
        the LaTeX rule the checker on a trace that gave it (``1/576`` for ``\\frac{1}{576}``: keys
        compare text, and HMMT's verdict undercounted against ``eval`` on the same traces)."""
        if answer is None or answer == self.gold:
            return answer is not None
        if self.cfg.answer_rule != "latex":
            return False
        decode = self.engine.tokenizer.decode
        return any(latex_right(decode(n.tokens), self.gold) for n in fin if n.answer == answer)
