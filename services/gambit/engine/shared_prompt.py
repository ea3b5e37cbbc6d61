"""Parallel samples of one prompt (``Engine.add_samples``): one prefill, its KV shared.

A search starts C traces of the same prompt (SC@C, STEP, Gambit's roots). Added one by one, the
prompt is prefilled C times and held C times in the cache. Here the first trace (the leader) is
prefilled alone; the others (its followers) wait outside the scheduler. When the leader's prefill
completes, each follower takes its KV as a fork does (full blocks shared, the partial last block
copied) and samples its own first token from the leader's last-position logits with its own seed and
parameters: the same draw it would have made after prefilling the prompt itself. A follower that
cannot get its partial block, or whose leader ends before its prefill completes, is queued to
prefill by itself (nothing is lost, only the sharing).
"""

from __future__ import annotations

from gambit.engine.block_manager import OutOfBlocks
from gambit.engine.sequence import Trace, TraceStatus


class SharedPrompts:
    def __init__(self, engine) -> None:
        self.engine = engine
        self.followers: dict[int, list[Trace]] = {}  # leader id -> followers waiting on its prefill
        self.leader_of: dict[int, int] = {}  # follower id -> leader id

    def __bool__(self) -> bool:
        return bool(self.followers)

    def wait_on(self, leader: Trace, followers: list[Trace]) -> None:
        for f in followers:
            f.status = TraceStatus.WAITING
            self.leader_of[f.id] = leader.id
        self.followers[leader.id] = followers

    def attach(self, samplers: list[Trace]) -> tuple[list[Trace], list[int]]:
        """Samplers with every follower whose leader's prefill completed this step appended; and the
        logits row each sampler draws from (a follower: its leader's)."""
        eng = self.engine
        out, rows = list(samplers), list(range(len(samplers)))
        for i, lead in enumerate(samplers):
            group = self.followers.pop(lead.id, None) if lead.num_cached == lead.prompt_len else None
            if group is None:
                continue
            pairs = []
            for f in group:
                self.leader_of.pop(f.id, None)
                pair, copied = None, False
                if len(eng.scheduler.running) < eng.config.max_num_seqs:
                    try:
                        pair = eng.blocks.fork(lead, f)
                        copied = True
                    except OutOfBlocks:
                        pass
                if eng._spec is not None:
                    eng._spec.on_fork(lead, f, pair, copied)
                if not copied:
                    eng.scheduler.add(f)  # prefills by itself
                    continue
                if pair is not None:
                    pairs.append(pair)
                eng.scheduler.add_running(f)
                eng.stats.shared_prompt_tokens += f.prompt_len
                out.append(f)
                rows.append(i)
            if pairs:  # the group's partial blocks in one copy, only the cached slots
                eng.runner.cache.copy_blocks(pairs, lead.prompt_len % eng.blocks.block_size)
        return out, rows

    def release(self, leader: Trace) -> None:
        """The leader ended (abort, eviction) before its prefill completed: followers go on alone."""
        for f in self.followers.pop(leader.id, ()):
            self.leader_of.pop(f.id, None)
            self.engine.scheduler.add(f)

    def drop(self, follower: Trace) -> None:
        """A waiting follower ended (abort)."""
        lead = self.leader_of.pop(follower.id, None)
        if lead is not None:
            group = self.followers.get(lead, [])
            group[:] = [f for f in group if f is not follower]
            if not group:
                self.followers.pop(lead, None)
