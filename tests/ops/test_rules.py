"""Prometheus rules with the real promtool: syntax (`check rules`) and unit tests (`test rules`) that
fire each alert on a synthetic series and keep it quiet on a healthy one. Dashboard queries are checked
by promtool too, as recording rules."""

from __future__ import annotations

import pytest
import yaml
from ops_util import REPO, run

from gambit.ops.alerts import ALERTS
from gambit.ops.dashboards import panel_queries
from gambit.serving.metrics import LATENCY_BUCKETS

RULES = REPO / "deploy" / "prometheus" / "gambit-rules.yaml"
P = "ray_gambit_"
RAY = 'application="gambit",deployment="Target"'  # labels Ray Serve adds; aggregation must drop them


def hist(name: str, counts: dict[str, str]) -> list[dict]:
    return [{"series": f'{P}{name}_bucket{{le="{le}",method="gambit",{RAY}}}', "values": v}
            for le, v in counts.items()]


def exported_hist(name: str, above: float) -> list[dict]:
    """Ten observations a minute, each just above ``above`` seconds, in the buckets the services export
    (a synthetic 300 s bucket let the 120 s alert fire here while the exporter's top bucket was 120, where
    histogram_quantile stops: it could never fire)."""
    counts = {f"{le:g}": "0x30" if le <= above else "0+10x30" for le in LATENCY_BUCKETS}
    return hist(name, {**counts, "+Inf": "0+10x30"})


def spec(decoding: str, drafts: str, accepted: str) -> list[dict]:
    """One decoding's speculative counters: verification forwards and the draft tokens they accepted."""
    return [{"series": f'{P}spec_decode_num_{name}_total{{decoding="{decoding}",{RAY}}}', "values": v}
            for name, v in (("drafts", drafts), ("accepted_tokens", accepted))]


# alert -> (firing input, eval time, healthy input, expected annotations' summary when firing)
SCENARIOS: dict[str, tuple[list[dict], str, list[dict]]] = {
    "GambitKVCacheSaturated": (
        [{"series": f"{P}kv_cache_usage_perc{{{RAY},replica='a'}}".replace("'", '"'), "values": "0.97x20"},
         {"series": f"{P}kv_cache_usage_perc{{{RAY},replica='b'}}".replace("'", '"'), "values": "0.30x20"}],
        "10m",
        [{"series": f"{P}kv_cache_usage_perc{{{RAY}}}", "values": "0.90x20"}]),
    "GambitScorerDown": (
        [{"series": f"{P}scorer_fallback_total{{{RAY}}}", "values": "0+5x20"}], "10m",
        [{"series": f"{P}scorer_fallback_total{{{RAY}}}", "values": "0x20"}]),
    # a Target emitting NaN states: rows left out all along; healthy: a stray row at 5, 12 and 17 minutes
    # (each a 5-minute rate above 0, never 10 minutes on end)
    "GambitScorerBadRows": (
        [{"series": f"{P}scorer_bad_rows_total{{{RAY}}}", "values": "0+30x30"}], "20m",
        [{"series": f"{P}scorer_bad_rows_total{{{RAY}}}", "values": "0x4 1x6 2x4 3x8"}]),
    "GambitTraceThroughputDrop": (
        [{"series": f"{P}generation_tokens_total{{{RAY}}}", "values": "0+6000x60 360600+600x30"},
         {"series": f"{P}num_requests_running{{{RAY}}}", "values": "3x90"}], "85m",
        [{"series": f"{P}generation_tokens_total{{{RAY}}}", "values": "0+6000x90"},
         {"series": f"{P}num_requests_running{{{RAY}}}", "values": "3x90"}]),
    "GambitHighErrorRate": (
        [{"series": f'{P}request_errors_total{{code="INTERNAL",rpc="Solve",{RAY}}}', "values": "0+10x20"},
         {"series": f'{P}e2e_request_latency_seconds_count{{method="gambit",{RAY}}}', "values": "0+100x20"}],
        "10m",
        [{"series": f'{P}request_errors_total{{code="INVALID_ARGUMENT",rpc="Solve",{RAY}}}',
          "values": "0+50x20"},
         # a client reusing run ids or without its token: the caller's doing, not a page
         {"series": f'{P}request_errors_total{{code="ALREADY_EXISTS",rpc="Solve",{RAY}}}',
          "values": "0+20x20"},
         {"series": f'{P}request_errors_total{{code="UNAUTHENTICATED",rpc="Solve",{RAY}}}',
          "values": "0+20x20"},
         {"series": f'{P}request_errors_total{{code="INTERNAL",rpc="Solve",{RAY}}}', "values": "0+1x20"},
         # other RPCs: a Score call fails per round, not per Solve (each counted against Solve calls before)
         {"series": f'{P}request_errors_total{{code="INTERNAL",rpc="Score",{RAY}}}', "values": "0+30x20"},
         {"series": f'{P}request_errors_total{{code="UNAVAILABLE",rpc="GetRun",{RAY}}}', "values": "0+10x20"},
         {"series": f'{P}e2e_request_latency_seconds_count{{method="gambit",{RAY}}}', "values": "0+100x20"}]),
    "GambitHighEndToEndLatency": (
        exported_hist("e2e_request_latency_seconds", 120.0), "20m",
        exported_hist("e2e_request_latency_seconds", 60.0)),
    "GambitHighTimeToFirstToken": (
        exported_hist("time_to_first_token_seconds", 10.0), "20m",
        exported_hist("time_to_first_token_seconds", 5.0)),
    "GambitQueueBacklog": (
        [{"series": f"{P}num_requests_waiting{{{RAY}}}", "values": "40x30"}], "20m",
        [{"series": f"{P}num_requests_waiting{{{RAY}}}", "values": "5x30"}]),
    # pr's tau falls from 3 to 1.5 at 5 h (a mismatched drafter); eagle3.1 keeps its tau 2.5
    "GambitSpecAcceptanceDrop": (
        spec("pr", "0+100x480", "0+200x300 60050+50x179") + spec("eagle3.1", "0+100x480", "0+150x480"),
        "400m",
        # healthy: pr's load triples at the same tau 3 (the 6-hour tau is a ratio, not a traffic level);
        # eagle3.1 always low (tau 1.2: a weak drafter, no drop); a drafter by path stops drafting at 5 h
        spec("pr", "0+100x300 30300+300x179", "0+200x300 60600+600x179")
        + spec("eagle3.1", "0+100x480", "0+20x480")
        + spec("other", "0+100x300 30000x180", "0+200x300 60000x180")),
}
# alert -> its summary when its scenario fires: each shows the value (a page says how bad it is)
FIRING_SUMMARY = {
    "GambitKVCacheSaturated": "KV cache above 95% on a Target replica for 5 minutes (97%)",
    "GambitScorerDown": "Rounds are ranked without the scorer (0.08 fallback Score calls/s): the Scorer is "
                        "unreachable or refuses the Target's calls",
    "GambitScorerBadRows": "Boundary states left out of Score calls for NaN, infinity or values past float16 "
                           "(0.50 rows/s for 10 minutes): those traces are ranked by their running mean, "
                           "not scored",
    "GambitTraceThroughputDrop": "Trace throughput (10 generated tokens/s) is below half its 1-hour average "
                                 "while runs are in flight",
    "GambitHighErrorRate": "9.091% of Solve calls end with a server-side gRPC error (above 5%)",
    "GambitHighEndToEndLatency": "p95 end-to-end Solve latency 2m 57s (above 120 s)",
    "GambitHighTimeToFirstToken": "p95 time to the first stream event 19.5s (above 10 s)",
    "GambitQueueBacklog": "40 runs queued for 10 minutes (above 32)",
    "GambitSpecAcceptanceDrop": "Acceptance length of pr 1.50 tokens per target forward over 15 minutes, "
                                "below 0.75x its 6-hour average",
}
# alert -> the labels its firing series carries beyond the rule's (a per-decoding alert names its decoding)
FIRING_LABELS = {"GambitSpecAcceptanceDrop": {"decoding": "pr"}}


def test_every_alert_has_a_scenario():
    assert set(SCENARIOS) == {a.name for a in ALERTS} == set(FIRING_SUMMARY)


def test_every_alert_shows_its_value_and_its_runbook():
    """A page that says "latency high" without how high, or where to look next, costs the on-call a
    dashboard round-trip: every summary templates $value and every rule names its runbook row."""
    for a in ALERTS:
        ann = a.rule()["annotations"]
        assert "$value" in ann["summary"], a.name
        assert ann["runbook"] == f"README.md#alerts ({a.name})" and ann["description"], a.name


def test_promtool_check_rules(promtool):
    r = run([promtool, "check", "rules", str(RULES)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in r.stdout


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    rules = [{"record": f"gambit:panel{i}:{j}", "expr": q}
             for i, qs in enumerate(panel_queries().values()) for j, q in enumerate(qs)]
    f = tmp_path / "panels.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = run([promtool, "check", "rules", str(f)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(rules)} rules found" in r.stdout


def _unit_test(promtool, tmp_path, alert: str, series: list[dict], at: str, firing: bool):
    a = next(a for a in ALERTS if a.name == alert)
    rule = a.rule()
    exp = []
    if firing:
        ann = {**rule["annotations"], "summary": FIRING_SUMMARY[alert]}
        exp = [{"exp_labels": {**rule["labels"], **FIRING_LABELS.get(alert, {})}, "exp_annotations": ann}]
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series,
                       "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}]}]}
    f = tmp_path / f"{alert}-{'fire' if firing else 'quiet'}.yaml"
    f.write_text(yaml.safe_dump(test, sort_keys=False))
    return run([promtool, "test", "rules", str(f)])


@pytest.mark.parametrize("alert", sorted(SCENARIOS))
def test_alert_fires_on_its_condition(promtool, tmp_path, alert):
    fire, at, _ = SCENARIOS[alert]
    r = _unit_test(promtool, tmp_path, alert, fire, at, firing=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("alert", sorted(SCENARIOS))
def test_alert_stays_quiet_when_healthy(promtool, tmp_path, alert):
    _, at, quiet = SCENARIOS[alert]
    r = _unit_test(promtool, tmp_path, alert, quiet, at, firing=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_unit_test_harness_detects_a_wrong_expectation(promtool, tmp_path):
    """The quiet series must not satisfy a firing expectation (the harness really compares)."""
    _, at, quiet = SCENARIOS["GambitScorerDown"]
    r = _unit_test(promtool, tmp_path, "GambitScorerDown", quiet, at, firing=True)
    assert r.returncode != 0 and "GambitScorerDown" in r.stdout + r.stderr
