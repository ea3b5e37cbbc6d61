"""A run's writes to the tree store: its counters (``meta``) and the nodes and rounds that changed
since the last write (``SearchRun`` mixes it in; the driver writes a ``flush`` at every round and at the end).
"""

from __future__ import annotations

from gambit.search.node_json import NodeJSON, NodeSnapshot
from gambit.search.store import EncodedNode, RunUpdate

SCORE_WRITE_EVERY = 4  # rounds: a node whose only change is new scores is rewritten at most this often


class RunPersist:
    """Needs the run's ``nodes``, counters, ``dirty``, ``scored``, ``written``, ``json``, ``pending_rounds``,
    ``meta_written``, ``result`` and ``sync_all`` on the instance."""

    def meta(self, tokens: int | None = None) -> dict:
        counters = {"step": self.step, "clock": self.clock, "next_round": self.next_round,
                    "round": self.round, "tokens": self.tokens if tokens is None else tokens,
                    "pruned": self.pruned, "branched": self.branched, "evicted": self.evicted,
                    "phase": self.phase, "threshold": self.threshold, "target": self.target}
        if self.meta_written:
            return counters
        return {"config": self.cfg.to_dict(), "prompt": self.prompt, "prompt_ids": self.prompt_ids,
                "gold": self.gold, "started_at": self.started_at, **counters}

    def _json(self, node_id: int) -> NodeJSON:
        j = self.json.get(node_id)
        if j is None:  # a reloaded run's node: its cache starts empty
            j = self.json[node_id] = NodeJSON()
        return j

    def flush(self, lazy: bool = False) -> RunUpdate:
        """The changes since the last write: counters, the nodes whose record changed (created or a
        new state: every round; new scores only: every ``SCORE_WRITE_EVERY`` rounds and at the end),
        the rounds, the result. A running node whose only change is new tokens is not rewritten (that
        was most of a round's cost); its stored tokens and scores lag, and
        ``meta["tokens"]`` is written consistent with the stored nodes, so a restart that adopts the
        engine's live trace (its tokens past the stored ones) counts every token once. ``lazy``: the
        store keeps node snapshots (``MemoryStore.lazy_nodes``) and encodes them when read."""
        self.sync_all()
        if self.result is not None or self.round % SCORE_WRITE_EVERY == 0:
            self.dirty |= self.scored
            self.scored = set()
        nodes = []
        for i in sorted(self.dirty):
            n = self.nodes[i]
            nodes.append(NodeSnapshot(n) if lazy else EncodedNode(i, self._json(i).encode(n)))
            self.written[i] = n.depth
        lag = sum(self.nodes[i].depth - self.written.get(i, 0) for i in self.active
                  if self.nodes[i].resident)
        up = RunUpdate(self.meta(self.tokens - lag), nodes, self.pending_rounds,
                       None if self.result is None else self.result.to_dict())
        self.meta_written = True
        self.dirty, self.pending_rounds = set(), []
        return up
