"""The Scorer's autoscaling policy: Serve's ongoing-requests rule, counting the direct endpoint's calls.

Most Score calls reach a Scorer replica on its own gRPC endpoint, which Serve never sees: by Serve's
default policy (ongoing requests through the proxy and handles / ``target_ongoing_requests``) a busy
Scorer looked idle and was never scaled up. Each replica reports its direct calls in flight
(``Scorer.record_autoscaling_stats``, metric ``DIRECT_ONGOING``); this policy adds them to Serve's count.

Serve pickles this module by value into its controller, which may not have gambit installed: it must
import nothing from gambit.
"""

from __future__ import annotations

from typing import Any

DIRECT_ONGOING = "gambit_direct_ongoing_requests"  # per replica: mean Score calls in flight on its endpoint
POLICY = "gambit.deployments.scorer_autoscaling:scorer_autoscaling_policy"  # autoscaling_config.policy


def direct_ongoing(ctx: Any) -> float:
    """The direct endpoints' calls in flight, summed over the running replicas (each aggregated over
    the look-back window by Serve; a replica that has not reported yet counts 0)."""
    per_replica = (ctx.aggregated_metrics or {}).get(DIRECT_ONGOING) or {}
    return float(sum(per_replica.values()))


def scorer_autoscaling_policy(ctx: Any) -> tuple[float, dict]:
    """Replicas wanted: all ongoing Score calls (Serve's, through the proxy, plus the direct endpoints')
    over ``target_ongoing_requests``, as Serve's default policy divides its own count. Serve applies the
    bounds, scaling factors and up/down delays around it."""
    if ctx.current_num_replicas == 0:
        return ctx.target_num_replicas, {}
    total = ctx.total_num_requests + direct_ongoing(ctx)
    return total / ctx.config.get_target_ongoing_requests(), {}
