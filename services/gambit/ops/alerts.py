"""Prometheus alerting rules, as data: one `Alert` per condition an operator must act on.

Expressions are written once with ``{p}`` for the exporter prefix (``ray_`` under Ray Serve). Each
alert also lists the queries that must return a series on a live deployment (`checks`): a threshold
comparison returns nothing while healthy, so the live check evaluates its parts instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gambit.ops.metrics import DEFAULT_PREFIX

# where each alert's runbook lives: the README's Alerts table, one row per alert (what it means, what to do)
RUNBOOK = "README.md#alerts"
# gRPC codes that are the caller's doing, not the service failing (a reused run id, a missing token).
CLIENT_CODES = "CANCELLED|INVALID_ARGUMENT|NOT_FOUND|ALREADY_EXISTS|UNAUTHENTICATED"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str  # PromQL with {p} for the prefix
    for_: str  # how long the condition must hold, e.g. "5m"
    severity: str  # "warning" | "critical"
    summary: str  # Prometheus template; shows the firing value ({{ $value }}) so a page says how bad it is
    action: str  # what the operator should do (README and the runbook annotation)
    checks: tuple[str, ...] = field(default=())  # queries that must return >= 1 series live

    def __post_init__(self):
        if self.severity not in ("warning", "critical"):
            raise ValueError(f"severity must be warning or critical, got {self.severity!r}")
        if "$value" not in self.summary:
            raise ValueError(f"alert {self.name}: summary must show the value ({{{{ $value }}}})")
        if not self.checks:
            raise ValueError(f"alert {self.name}: checks must name the queries its expression reads")

    def rule(self, prefix: str = DEFAULT_PREFIX) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr.format(p=prefix),
            "for": self.for_,
            "labels": {"severity": self.severity, "service": "gambit"},
            "annotations": {"summary": self.summary, "description": self.action,
                            "runbook": f"{RUNBOOK} ({self.name})"},
        }


def _quantile(q: float, hist: str, window: str = "5m") -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({{p}}{hist}_bucket[{window}])))"


def _by_decoding(counter: str, window: str) -> str:
    return f"sum by (decoding) (rate({{p}}gambit_spec_decode_{counter}_total[{window}]))"


def _tau(window: str) -> str:
    """Acceptance length tau over ``window``, per decoding: (accepted + drafts) / drafts, tokens per target
    forward (the dashboard's "Acceptance length" panel, so a page and the panel show the same number)."""
    drafts = _by_decoding("num_drafts", window)
    return f"({_by_decoding('num_accepted_tokens', window)} + {drafts}) / {drafts}"


ALERTS: tuple[Alert, ...] = (
    Alert(
        name="GambitKVCacheSaturated",
        expr="max({p}gambit_kv_cache_usage_perc) > 0.95",
        for_="5m", severity="warning",
        summary="KV cache above 95% on a Target replica for 5 minutes ({{ $value | humanizePercentage }})",
        action="Traces are being evicted or pruned for memory. Add Target replicas or GPU workers "
               "(gpuWorkers.replicas), lower the trace pool size C, or lower max_ongoing_requests.",
        checks=("max({p}gambit_kv_cache_usage_perc)",),
    ),
    Alert(
        name="GambitScorerDown",
        expr="sum(rate({p}gambit_scorer_fallback_total[5m])) > 0",
        for_="2m", severity="critical",
        summary='Rounds are ranked without the scorer ({{ $value | printf "%.2f" }} fallback Score '
                "calls/s): the Scorer is unreachable or refuses the Target's calls",
        action="Check the Scorer deployment's replicas in the Ray dashboard and `gambit cluster status`; "
               "look at the CPU worker pods' logs. If the Scorer is up it refuses the calls: UNAUTHENTICATED "
               "on Score (dashboard: Errors by code) means the Target's and Scorer's GAMBIT_TOKEN differ; a "
               "Target log line naming two widths means the Scorer reads another hidden width. Search "
               "quality falls back to unscored ranking.",
        checks=("sum(rate({p}gambit_scorer_fallback_total[5m]))",),
    ),
    Alert(
        name="GambitScorerBadRows",
        # a model emitting NaN or inf everywhere: its rows are left out, each scored its trace's running
        # mean, so no call fails and GambitScorerDown stays quiet; a stray row now and then is no page
        expr="sum(rate({p}gambit_scorer_bad_rows_total[5m])) > 0",
        for_="10m", severity="warning",
        summary='Boundary states left out of Score calls for NaN, infinity or values past float16 '
                '({{ $value | printf "%.2f" }} rows/s for 10 minutes): those traces are ranked by their '
                "running mean, not scored",
        action="The Target's hidden states (or confidence features) hold non-finite or huge values: read "
               "the Target's log warning (it names the traces) and look for a broken or wrongly converted "
               "target checkpoint, a dtype overflow (float16) or a bad GPU. Search quality falls back to "
               "unscored ranking for those traces until it stops.",
        # the counter is exported only after its first bad row (Ray): the check reads 0 until then
        checks=("sum(rate({p}gambit_scorer_bad_rows_total[5m])) "
                "or 0 * sum(rate({p}gambit_generation_tokens_total[5m]))",),
    ),
    Alert(
        name="GambitTraceThroughputDrop",
        expr="sum(rate({p}gambit_generation_tokens_total[5m])) "
             "< 0.5 * sum(rate({p}gambit_generation_tokens_total[1h])) "
             "and sum({p}gambit_num_requests_running) > 0",
        for_="10m", severity="warning",
        summary="Trace throughput ({{ $value | humanize }} generated tokens/s) is below half its 1-hour "
                "average while runs are in flight",
        action="Look for a slow or restarting Target replica (GPU worker pod events, Ray dashboard), "
               "KV saturation (evictions) or a noisy neighbour on the GPU node.",
        checks=("sum(rate({p}gambit_generation_tokens_total[5m]))",
                "sum(rate({p}gambit_generation_tokens_total[1h]))",
                "sum({p}gambit_num_requests_running)"),
    ),
    Alert(
        name="GambitHighErrorRate",
        # Solve calls only: the Scorer's per-round Score errors and GetRun / CancelRun are other RPCs
        expr=f'sum(rate({{p}}gambit_request_errors_total{{{{rpc="Solve",code!~"{CLIENT_CODES}"}}}}[5m])) '
             "/ (sum(rate({p}gambit_e2e_request_latency_seconds_count[5m])) "
             '+ sum(rate({p}gambit_request_errors_total{{rpc="Solve"}}[5m]))) > 0.05',
        for_="5m", severity="critical",
        summary="{{ $value | humanizePercentage }} of Solve calls end with a server-side gRPC error "
                "(above 5%)",
        action="Break the errors down by code on the dashboard (Errors by code). UNAVAILABLE or "
               "RESOURCE_EXHAUSTED: scale out or lower load; INTERNAL: read the Coordinator's logs.",
        checks=("sum(rate({p}gambit_request_errors_total[5m]))",
                "sum(rate({p}gambit_e2e_request_latency_seconds_count[5m]))"),
    ),
    Alert(
        name="GambitHighEndToEndLatency",
        expr=_quantile(0.95, "gambit_e2e_request_latency_seconds") + " > 120",
        for_="10m", severity="warning",
        summary="p95 end-to-end Solve latency {{ $value | humanizeDuration }} (above 120 s)",
        action="Check queue depth (runs waiting) and KV utilisation; add Target replicas, or lower the "
               "default trace budget per run.",
        checks=(_quantile(0.95, "gambit_e2e_request_latency_seconds"),),
    ),
    Alert(
        name="GambitHighTimeToFirstToken",
        expr=_quantile(0.95, "gambit_time_to_first_token_seconds") + " > 10",
        for_="10m", severity="warning",
        summary="p95 time to the first stream event {{ $value | humanizeDuration }} (above 10 s)",
        action="Runs wait in the queue: see runs waiting on the dashboard; scale the Target or the "
               "Coordinator out, or lower max_ongoing_requests so the proxy sheds load instead.",
        checks=(_quantile(0.95, "gambit_time_to_first_token_seconds"),),
    ),
    Alert(
        name="GambitQueueBacklog",
        expr="sum({p}gambit_num_requests_waiting) > 32",
        for_="10m", severity="warning",
        summary="{{ $value }} runs queued for 10 minutes (above 32)",
        action="Demand exceeds capacity: add GPU workers and Target replicas (see Scaling in the README).",
        checks=("sum({p}gambit_num_requests_waiting)",),
    ),
    Alert(
        name="GambitSpecAcceptanceDrop",
        # the 6-hour tau is the ratio of 6-hour rates: each forward weighs the same, busy hour or quiet
        expr=f"{_tau('15m')} < 0.75 * ({_tau('6h')}) and {_by_decoding('num_drafts', '15m')} > 0",
        for_="30m", severity="warning",
        summary='Acceptance length of {{ $labels.decoding }} {{ $value | printf "%.2f" }} tokens per target '
                "forward over 15 minutes, below 0.75x its 6-hour average",
        action="Each speculative forward yields fewer tokens, so speculative traces decode slower (the "
               "answers still follow the target: rejected drafts are decoded by it). Causes: a drafter that "
               "does not match the Target (a new target checkpoint without its drafter, a wrong "
               "spec.drafters folder, a corrupted drafter file) or a workload shift (other problems, a "
               "higher temperature). Compare the dashboard's Acceptance length panel per decoding and what "
               "changed when it fell; redeploy the matching drafter, or have clients use decoding plain.",
        checks=(_by_decoding("num_accepted_tokens", "15m"), _by_decoding("num_drafts", "15m"),
                _by_decoding("num_accepted_tokens", "6h"), _by_decoding("num_drafts", "6h")),
    ),
)


def rule_groups(prefix: str = DEFAULT_PREFIX) -> dict:
    """The Prometheus rules file (``groups:``), also the PrometheusRule's spec."""
    return {"groups": [{"name": "gambit.alerts", "rules": [a.rule(prefix) for a in ALERTS]}]}


def live_checks(prefix: str = DEFAULT_PREFIX) -> dict[str, list[str]]:
    return {a.name: [c.format(p=prefix) for c in a.checks] for a in ALERTS}
