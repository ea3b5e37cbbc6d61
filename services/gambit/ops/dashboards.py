"""Grafana dashboards, built with grafana-foundation-sdk (never hand-written JSON).

Every panel reads the Prometheus datasource chosen in the ``datasource`` variable (never a fixed id)
and builds metric names from the ``prefix`` variable (``ray_`` under Ray Serve, empty for the bare
prometheus-client names). `PANELS` is the data; `build_dashboard` renders it; the live check runs
each panel query against a real Prometheus after substituting the variables (`panel_queries`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef, VariableOption

from gambit.ops.metrics import DEFAULT_PREFIX, metric

DASHBOARD_UID = "gambit-overview"
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    description: str
    queries: tuple[tuple[str, str], ...]  # (PromQL with {m:<contract name>} and $__rate_interval, legend)
    width: int = 12


def _q(template: str) -> str:
    """Validate every `{m:name}` against the metrics contract and keep it as a template."""
    import re

    for name in re.findall(r"\{m:([a-z0-9_]+)\}", template):
        metric(name)  # raises for a name outside CONTRACTS.md §6
    return template


def _or_zero(expr: str) -> str:
    """Rare-event counters: Ray exports a counter only after its first increment (and refuses inc(0)),
    so show 0 until then instead of "No data", as long as the Target is exporting at all."""
    return f"({expr}) or (0 * sum(rate({{m:gambit_generation_tokens_total}}[{RATE}])))"


def _pct(q: float, hist: str) -> tuple[str, str]:
    expr = f"histogram_quantile({q}, sum by (le) (rate({{m:{hist}_bucket}}[{RATE}])))"
    return (_q(expr), f"p{round(q * 100)}")


PANELS: tuple[Panel, ...] = (
    Panel("Trace throughput", "suffix: tok/s", "Generated tokens per second across all Target replicas "
          "(prompt tokens prefilled, and those taken from a shared prefill, separately).", (
              (_q(f"sum(rate({{m:gambit_generation_tokens_total}}[{RATE}]))"), "generated"),
              (_q(f"sum(rate({{m:gambit_prompt_tokens_total}}[{RATE}]))"), "prompt"),
              (_q(f"sum(rate({{m:gambit_prompt_tokens_shared_total}}[{RATE}]))"), "prompt, shared"))),
    Panel("KV cache utilisation", "percentunit", "KV blocks used / total per Target replica; above 95% "
          "traces get evicted or pruned.", (
              (_q("max({m:gambit_kv_cache_usage_perc})"), "max"),
              (_q("avg({m:gambit_kv_cache_usage_perc})"), "mean"))),
    Panel("Acceptance length (tokens per target forward)", "short", "tau = (accepted + drafts) / drafts over "
          "speculative verification forwards (1: no draft token accepted), per decoding method (pr, "
          "eagle3.1, ...; other: a drafter by path); accepted / drafted tokens; and "
          "steps per second whose speculative traces decoded plainly (batch above spec.max_batch).", (
              (_q(f"(sum by (decoding) (rate({{m:gambit_spec_decode_num_accepted_tokens_total}}[{RATE}])) + "
                  f"sum by (decoding) (rate({{m:gambit_spec_decode_num_drafts_total}}[{RATE}]))) / "
                  f"sum by (decoding) (rate({{m:gambit_spec_decode_num_drafts_total}}[{RATE}]))"),
               "tau {{decoding}}"),
              (_q(f"sum by (decoding) (rate({{m:gambit_spec_decode_num_accepted_tokens_total}}[{RATE}])) / "
                  f"sum by (decoding) (rate({{m:gambit_spec_decode_num_draft_tokens_total}}[{RATE}]))"),
               "draft acceptance rate {{decoding}}"),
              (_q(_or_zero(f"sum(rate({{m:gambit_spec_decode_capped_steps_total}}[{RATE}]))")),
               "capped steps/s"))),
    Panel("Active vs ghost traces", "short", "Tree view: active and ghost (evicted, still in the pool) "
          "traces; scheduler view: traces holding KV.", (
              (_q("sum({m:gambit_traces_active})"), "active"),
              (_q("sum({m:gambit_traces_ghost})"), "ghost"),
              (_q("sum({m:gambit_traces_resident})"), "resident"))),
    Panel("Prunes, branches, evictions", "ops", "Tournament events per second; each shows 0 until its "
          "first one (Ray exports a counter only after its first increment, and a run whose traces tie "
          "makes no swap).", (
        (_q(_or_zero(f"sum(rate({{m:gambit_prunes_total}}[{RATE}]))")), "prunes"),
        (_q(_or_zero(f"sum(rate({{m:gambit_branches_total}}[{RATE}]))")), "branches"),
        (_q(_or_zero(f"sum(rate({{m:gambit_evictions_total}}[{RATE}]))")), "evictions"),
        (_q(f"sum(rate({{m:gambit_rounds_total}}[{RATE}]))"), "rounds"))),
    Panel("Runs running / waiting", "short", "Runs in flight on the Targets (held ones included), those "
          "a Target holds until their C fits its engine batch (held: queued for batch slots), and runs a "
          "Coordinator accepted, not started yet (waiting: queue depth).", (
        (_q("sum({m:gambit_num_requests_running})"), "running"),
        (_q("sum({m:gambit_num_requests_held})"), "held (batch slots)"),
        (_q("sum({m:gambit_num_requests_waiting})"), "waiting"))),
    Panel("Batch slots", "short", "Engine batch slots (max_num_seqs) of all Targets, and those the launched "
          "runs' pools hold (min(C, max_num_seqs) each): a Gambit run launches only when its C fits in "
          "a Target's free slots, else it is held there (used can pass total where runs of other methods "
          "launch past the batch: their traces wait their turn).", (
        (_q("sum({m:gambit_batch_slots_used})"), "used"),
        (_q("sum({m:gambit_batch_slots_total})"), "total"))),
    Panel("Time to first event", "s", "Solve request to its first stream event.",
          tuple(_pct(q, "gambit_time_to_first_token_seconds") for q in (0.5, 0.95, 0.99))),
    Panel("End-to-end latency", "s", "Solve request to its result.",
          tuple(_pct(q, "gambit_e2e_request_latency_seconds") for q in (0.5, 0.95, 0.99))),
    Panel("Scorer latency and guidance sync", "s", "One Score call: scored by the Scorer, and as a Target "
          "waits for it (states to the Scorer and back).",
          tuple((e, f"scorer {legend}") for e, legend in (_pct(q, "gambit_scorer_latency_seconds")
                                                        for q in (0.5, 0.95)))
          + tuple((e, f"sync {legend}") for e, legend in (_pct(q, "gambit_guidance_sync_seconds")
                                                      for q in (0.5, 0.95)))),
    Panel("Scorer batch size and fallbacks", "short", "Mean states per Score call; rounds ranked without the "
          "scorer per second (non-zero: the Scorer is unreachable or reads another width); rows left out per "
          "second for NaN, infinity or values past float16 (non-zero: the Target emits broken states); trace "
          "histories a sequence scorer evicted per second (non-zero: traces never dropped, or more live "
          "traces than its max_keys).", (
              (_q(f"sum(rate({{m:gambit_scorer_batch_size_sum}}[{RATE}])) / "
                  f"sum(rate({{m:gambit_scorer_batch_size_count}}[{RATE}]))"), "mean batch"),
              (_q(_or_zero(f"sum(rate({{m:gambit_scorer_fallback_total}}[{RATE}]))")), "fallbacks/s"),
              (_q(_or_zero(f"sum(rate({{m:gambit_scorer_bad_rows_total}}[{RATE}]))")), "bad rows/s"),
              (_q(_or_zero(f"sum(rate({{m:gambit_scorer_evictions_total}}[{RATE}]))")),
               "histories evicted/s"))),
    Panel("Errors by code", "reqps", "RPCs ended with a non-OK gRPC status, by RPC (Solve, GetRun, "
          "CancelRun; Score, Info: the Scorer's) and code.", (
        (_q(f"sum by (rpc, code) (rate({{m:gambit_request_errors_total}}[{RATE}]))"), "{{rpc}} {{code}}"),)),
    Panel("Traces started / finished", "ops", "Traces started (incl. branches) and ended, by reason.", (
        (_q(f"sum(rate({{m:gambit_traces_started_total}}[{RATE}]))"), "started"),
        (_q(f"sum by (reason) (rate({{m:gambit_traces_finished_total}}[{RATE}]))"), "{{reason}}"))),
)


def _render(template: str, prefix: str) -> str:
    import re

    return re.sub(r"\{m:([a-z0-9_]+)\}", lambda m: prefix + m.group(1), template)


def panel_queries(prefix: str = DEFAULT_PREFIX, rate_interval: str = "1m") -> dict[str, list[str]]:
    """Each panel's queries with the variables filled in, as Grafana would send them."""
    return {p.title: [_render(q, prefix).replace(RATE, rate_interval) for q, _ in p.queries] for p in PANELS}


def build_dashboard(prefix: str = DEFAULT_PREFIX) -> dict:
    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    d = (gd.Dashboard("Gambit overview").uid(DASHBOARD_UID).tags(["gambit"]).refresh("30s")
         .time("now-1h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .description("Gambit reasoning service: throughput, KV, speculative decoding, tournament, latency, "
                      "scorer, errors. Generated by `gambit deploy generate`.")
         .with_variable(gd.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .with_variable(gd.TextBoxVariable("prefix").label("Metric prefix").default_value(prefix)
                        .current(VariableOption(selected=True, text=prefix, value=prefix))
                        .description("ray_ under Ray Serve; empty for the embedded prometheus-client names")))
    for i, p in enumerate(PANELS):
        panel = (ts.Panel().id(i + 1).title(p.title).description(p.description).unit(p.unit)
                 .datasource(ds).height(8).span(p.width).fill_opacity(10))
        for j, (q, legend) in enumerate(p.queries):
            panel = panel.with_target(gp.Dataquery().expr(_render(q, "${prefix}")).legend_format(legend)
                                      .ref_id(chr(ord("A") + j)).datasource(ds))
        d = d.with_panel(panel)
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def dashboard_json(prefix: str = DEFAULT_PREFIX) -> str:
    return json.dumps(build_dashboard(prefix), indent=2, sort_keys=True) + "\n"
