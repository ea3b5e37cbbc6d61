"""Serve request router of the Target deployment: runs go where the KV can hold them.

Serve's default router picks the less busy of two random replicas by requests in flight; a run's
cost is its KV reservation, which differs by C, max_tokens and prompt, and its C batch slots. Each
Target reports its KV and batch slots (``record_routing_stats``, every ``STATS_PERIOD_S``); this
router adds the runs it routed since a replica's last report, estimates the new run's need and ranks
the replicas with ``gambit.serving.kv_balance.rank`` (where it launches at once first). ``avoid`` (a
``run`` keyword) names replicas that already refused the run. Other calls (``cancel``, ``load``)
keep Serve's usual choice: any replica with room.

The ranking is the request's own (its need, its ``avoid``), so the replica it picks goes to that
request, never to the oldest one pending (Serve's ``FIFOMixin`` did that: a run that one replica
refused could be handed that replica again and end RESOURCE_EXHAUSTED while others had room). A run
counts on its replica from the moment it is assigned, not once the replica accepted it (a round trip
later): a burst of runs assigned meanwhile all went to the same, first-ranked replica.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from gambit.serving.kv_balance import ReplicaLoad, estimate_need, rank

STATS_PERIOD_S = 1.0  # how often each Target reports its KV (Serve calls record_routing_stats)
ROUTED_TTL_S = 30.0  # a routed run not yet seen in any report is forgotten after this

log = logging.getLogger(__name__)


class KVAwareRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        # replica -> (when, blocks, batch slots, request id) of the runs routed to it since its report
        self.routed: dict[str, list[tuple[float, int, int, str]]] = {}

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
        """Each replica's last report plus what this router sent it since; and who has not reported.
        Replicas no longer among ``replicas`` (Serve passes them all) are forgotten."""
        now, loads, unknown, routed = time.time(), [], [], {}
        for r in replicas:
            rid, stats = r.replica_id.unique_id, r.routing_stats or {}
            stamp = _stamp(stats)
            sent = [x for x in self.routed.get(rid, []) if x[0] > stamp and now - x[0] < ROUTED_TTL_S]
            routed[rid] = sent
            load = ReplicaLoad.from_stats(rid, stats)
            if load is None:
                unknown.append(rid)
                continue
            loads.append(replace(load, reserved_blocks=load.reserved_blocks + sum(x[1] for x in sent),
                                 runs=load.runs + len(sent),
                                 batch_slots=load.batch_slots + sum(x[2] for x in sent)))
        self.routed = routed  # a replica gone (dead, scaled down) no longer keeps its list
        return loads, unknown

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        try:
            run = self._run_args(pending_request)
            if run is None or len(candidate_replicas) < 2:
                return [candidate_replicas]
            problem, cfg, avoid = run
            loads, unknown = self.loads(candidate_replicas)
            need = {x.replica: _need(problem, cfg, x) for x in loads}
            groups = rank(loads, need, unknown, avoid, _capacity(cfg))
        except Exception:  # raised here, Serve dropped the request: its caller waited for ever
            log.exception("KV-aware ranking failed; any replica with room takes the request")
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        return [[by_id[rid] for rid in group] for group in groups]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata=None) -> None:
        """The replica goes to the request it was ranked for (Serve's base matches the request id), and
        its run counts there at once."""
        pr = self._pending_requests_by_id.get(request_metadata.internal_request_id) \
            if request_metadata is not None else None
        super()._fulfill_next_pending_request(replica, request_metadata)
        done = pr is not None and pr.future.done() and not pr.future.cancelled()
        if done and pr.future.result() is replica:
            self.count_routed(pr, replica)

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        """The replica accepted the request: counted already when it was assigned (else now)."""
        r = self._replicas.get(replica_id)
        if r is not None:
            self.count_routed(pending_request, r)

    def count_routed(self, pr: PendingRequest, replica: RunningReplica) -> None:
        """Add ``pr``'s run to what ``replica`` holds until its next report covers it (once)."""
        run = self._run_args(pr)
        if run is None:
            return
        problem, cfg, _ = run
        rid, key = replica.replica_id.unique_id, getattr(pr.metadata, "internal_request_id", "") or ""
        sent = self.routed.setdefault(rid, [])
        if key and any(x[3] == key for x in sent):
            return
        load = ReplicaLoad.from_stats(rid, replica.routing_stats or {})
        if load is None:
            return
        try:
            entry = (time.time(), _need(problem, cfg, load), load.slots(_capacity(cfg)), key)
        except Exception:  # a request the ranking could not read either (logged there)
            return
        sent.append(entry)


def _stamp(stats: dict) -> float:
    """When the replica made its report; 0 where it is missing or not a number (all routed runs count)."""
    try:
        return float(stats.get("stamp", 0.0))
    except (TypeError, ValueError):
        return 0.0


def _capacity(cfg: dict) -> int:
    return int(cfg.get("capacity", 1))


def _need(problem: str, cfg: dict, load: ReplicaLoad) -> int:
    return estimate_need(problem, _capacity(cfg), int(cfg.get("max_tokens", 1)), load)
