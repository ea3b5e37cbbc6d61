"""A run's limits: the token budget shared out before its last steps, the wall clock, and
``stop_when_decided`` (``SearchRun`` mixes it in; the driver asks ``over_limit`` and ``decided`` each step).
"""

from __future__ import annotations

import time
from dataclasses import replace

from gambit.search import tree as T


class RunLimits:
    """Needs ``cfg``, ``nodes``, ``traces``, ``tokens``, ``votes``, ``active``, ``t0``, ``engine``,
    ``limit_hit``, ``budget_cut``, ``budget_caps`` and ``sync_all``/``_end``/``is_done`` on the instance."""

    def fit_budget(self) -> None:
        """Before a step: a run nearer its ``max_total_tokens`` than one step's tokens (one a trace plain,
        up to γ + 1 speculative) shares what is left among its running traces as token caps, the best
        ranked first, and stops those that get none ("limit"): it ends at the budget exactly. Checked
        after the step alone, a budget of 1 at C = 64 generated 64 tokens."""
        c = self.cfg
        if not c.max_total_tokens or not self.traces:
            return
        self.sync_all()
        per_step = 1 if c.decoding == "plain" else self.engine.config.spec.gamma + 1
        left, n = c.max_total_tokens - self.tokens, len(self.traces)
        if left >= n * per_step:
            return
        ranked = sorted((self.nodes[i] for i in self.traces), key=lambda x: -x.rank_score(c.rank))
        share, extra = divmod(max(left, 0), n)
        for k, node in enumerate(ranked):
            give = share + (k < extra)
            if not give:
                self._end(node, T.STOPPED, "limit")
                self.limit_hit = f"max_total_tokens {c.max_total_tokens}"  # "limit", once this step ran
                continue
            t = self.traces[node.id]
            own = self.budget_caps.setdefault(node.id, t.params.max_tokens)
            t.params = replace(t.params, max_tokens=min(own, t.num_generated + give))

    def decided(self) -> bool:
        """``stop_when_decided``: the leading answer has more votes than the runner-up could reach
        if every trace still active answered for it (refills after that are not counted)."""
        if not self.cfg.stop_when_decided or self.cfg.method != "gambit":
            return False
        votes = self.votes
        if not votes:
            return False
        top = sorted(votes.values(), reverse=True) + [0]
        return top[0] > top[1] + len(self.active)

    def over_limit(self) -> bool:
        """Whether a run limit is reached; ``limit_hit`` says which (the result and the client say it)."""
        c = self.cfg
        if self.limit_hit:  # ``fit_budget`` stopped traces for the budget
            return True
        if c.max_total_tokens:
            self.sync_all()
            # spent with traces left, or a trace cut at its budget cap (speculative steps: every trace
            # may get a share, so none is stopped by ``fit_budget`` itself); not when all ended by themselves
            spent, done = self.tokens >= c.max_total_tokens, self.is_done()
            if (spent and not done) or (self.budget_cut and (spent or done)):
                self.limit_hit = f"max_total_tokens {c.max_total_tokens}"
                return True
        if self.out_of_time():
            self.limit_hit = f"max_wall_s {c.max_wall_s:g}"
            return True
        return False

    def out_of_time(self) -> bool:
        """Whether ``max_wall_s`` passed since ``t0`` (its submit: a held run's wait counts)."""
        return bool(self.cfg.max_wall_s) and time.perf_counter() - self.t0 >= self.cfg.max_wall_s
