"""Serve request router of the Target deployment: runs go where the KV can hold them.

Serve's default router picks the less busy of two random replicas by requests in flight; a run's
cost is its KV reservation, which differs by C, max_tokens and prompt, and its C batch slots. Each
Target reports its KV and batch slots (``record_routing_stats``, every ``STATS_PERIOD_S``); this
router adds the runs it routed since a replica's last report, estimates the new run's need and ranks
the replicas with ``gambit.serving.kv_balance.rank`` (where it launches at once first). ``avoid`` (a
``run`` keyword) names replicas that already refused the run. Other calls (``cancel``, ``load``)
keep Serve's usual choice: any replica with room.
"""

from __future__ import annotations

import time
from dataclasses import replace

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from gambit.serving.kv_balance import ReplicaLoad, estimate_need, rank

STATS_PERIOD_S = 1.0  # how often each Target reports its KV (Serve calls record_routing_stats)
ROUTED_TTL_S = 30.0  # a routed run not yet seen in any report is forgotten after this


class KVAwareRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        # replica -> (when, blocks, batch slots) of the runs routed to it since its report
        self.routed: dict[str, list[tuple[float, int, int]]] = {}

    @staticmethod
    def _run_args(pr: PendingRequest | None) -> tuple[str, dict, tuple] | None:
        """(problem, cfg, avoid) of a ``run`` call, else None."""
        if pr is None or pr.metadata.call_method != "run" or len(pr.args) < 3:
            return None
        problem, cfg = pr.args[1], pr.args[2]
        if not isinstance(problem, str) or not isinstance(cfg, dict):
            return None
        return problem, cfg, tuple(pr.kwargs.get("avoid", ()))

    def loads(self, replicas: list[RunningReplica]) -> tuple[list[ReplicaLoad], list[str]]:
        """Each replica's last report plus what this router sent it since; and who has not reported."""
        now, loads, unknown = time.time(), [], []
        for r in replicas:
            rid, stats = r.replica_id.unique_id, r.routing_stats or {}
            stamp = float(stats.get("stamp", 0.0))
            sent = [x for x in self.routed.get(rid, []) if x[0] > stamp and now - x[0] < ROUTED_TTL_S]
            self.routed[rid] = sent
            load = ReplicaLoad.from_stats(rid, stats)
            if load is None:
                unknown.append(rid)
                continue
            loads.append(replace(load, reserved_blocks=load.reserved_blocks + sum(x[1] for x in sent),
                                 runs=load.runs + len(sent),
                                 batch_slots=load.batch_slots + sum(x[2] for x in sent)))
        return loads, unknown

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        run = self._run_args(pending_request)
        if run is None or len(candidate_replicas) < 2:
            return [candidate_replicas]
        problem, cfg, avoid = run
        loads, unknown = self.loads(candidate_replicas)
        need = {x.replica: _need(problem, cfg, x) for x in loads}
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        groups = rank(loads, need, unknown, avoid, _capacity(cfg))
        return [[by_id[rid] for rid in group] for group in groups]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        run = self._run_args(pending_request)
        if run is None:
            return
        problem, cfg, _ = run
        rid = replica_id.unique_id
        r = self._replicas.get(replica_id)
        load = ReplicaLoad.from_stats(rid, (r.routing_stats or {}) if r is not None else {})
        if load is not None:
            self.routed.setdefault(rid, []).append((time.time(), _need(problem, cfg, load),
                                                    load.slots(_capacity(cfg))))


def _capacity(cfg: dict) -> int:
    return int(cfg.get("capacity", 1))


def _need(problem: str, cfg: dict, load: ReplicaLoad) -> int:
    return estimate_need(problem, _capacity(cfg), int(cfg.get("max_tokens", 1)), load)
