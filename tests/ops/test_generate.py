"""deploy/ is generated from code: the files in the repository must equal what the code writes now."""

from __future__ import annotations

import json
import re

import pytest

from gambit.ops import metrics
from gambit.ops.alerts import ALERTS, rule_groups
from gambit.ops.dashboards import PANELS, build_dashboard, panel_queries
from gambit.ops.generate import REPO, VALUES, check, generated_files


def test_generated_files_match_the_code():
    diffs = check()
    assert not diffs, "deploy/ is stale; run `gambit deploy generate`:\n" + "".join(diffs)[:4000]


def test_check_reports_a_hand_edit(tmp_path):
    for rel, text in {**generated_files(), VALUES: (REPO / VALUES).read_text()}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert check(tmp_path) == []
    rules = tmp_path / "deploy/prometheus/gambit-rules.yaml"
    rules.write_text(rules.read_text().replace("> 0.95", "> 0.99"))
    (diff,) = check(tmp_path)
    assert "-  expr: max(ray_gambit_kv_cache_usage_perc) > 0.99" in diff.replace("    ", "  ")
    assert "+  expr: max(ray_gambit_kv_cache_usage_perc) > 0.95" in diff.replace("    ", "  ")


def test_serve_env_files_carry_what_gambit_serve_sets():
    import yaml

    from gambit.deployments.local import SERVE_ENV
    from gambit.ops.serve_env import env_file

    files = generated_files()
    assert yaml.safe_load(files["helm/gambit/files/serve-env.yaml"]) == SERVE_ENV
    lines = [x for x in files["deploy/serve.env"].splitlines() if x and not x.startswith("#")]
    assert dict(x.split("=", 1) for x in lines) == SERVE_ENV
    assert "RAY_worker_niceness=0" in lines
    with pytest.raises(ValueError, match="KEY=VALUE"):
        env_file({"A": "two words"})


def test_dashboard_datasource_is_a_variable_never_an_id():
    d = build_dashboard()
    names = [v["name"] for v in d["templating"]["list"]]
    assert names == ["datasource", "prefix"]
    ds_var = d["templating"]["list"][0]
    assert ds_var["type"] == "datasource" and ds_var["query"] == "prometheus"
    blob = json.dumps(d)
    uids = set(re.findall(r'"uid": "([^"]*)"', blob)) - {"gambit-overview"}
    assert uids == {"${datasource}"}
    for p in d["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert "${prefix}gambit_" in t["expr"] and "ray_gambit" not in t["expr"]


def test_dashboard_has_the_required_panels():
    titles = {p.title for p in PANELS}
    for need in ("Trace throughput", "KV cache utilisation", "Acceptance length (tokens per target forward)",
                 "Active vs ghost traces", "Prunes, branches, evictions", "Time to first event",
                 "End-to-end latency", "Scorer latency and guidance sync", "Errors by code"):
        assert need in titles
    q = panel_queries()
    for title in ("Time to first event", "End-to-end latency"):
        assert [s.split(",")[0] for s in q[title]] == [f"histogram_quantile({x}" for x in (0.5, 0.95, 0.99)]
    # the Scorer's own time and the Targets' wait, apart: the Targets recorded theirs under the Scorer's name
    want = [(f"histogram_quantile({x},", f"(rate(ray_gambit_{m}_bucket[1m])))")
            for m in ("scorer_latency_seconds", "guidance_sync_seconds") for x in (0.5, 0.95)]
    got = q["Scorer latency and guidance sync"]
    assert len(got) == 4
    assert all(g.startswith(a) and g.endswith(b) for g, (a, b) in zip(got, want, strict=True))
    assert q["Errors by code"] == ["sum by (rpc, code) (rate(ray_gambit_request_errors_total[1m]))"]


def test_every_query_names_only_contract_metrics():
    used = set()
    exprs = [e for qs in panel_queries(prefix="").values() for e in qs]
    exprs += [r["expr"] for r in rule_groups(prefix="")["groups"][0]["rules"]]
    for e in exprs:
        for name in re.findall(r"\bgambit_[a-z0-9_]+", e):
            metrics.metric(name, prefix="")  # raises for a name outside CONTRACTS.md §6
            used.add(re.sub(r"_(bucket|sum|count)$", "", name) if name.endswith(("_bucket", "_sum", "_count"))
                     and not name.endswith("_total") else name)
    # every contract metric is on the dashboard or in an alert
    assert set(metrics.ALL) - used == set()


def test_alerts_cover_the_issue_list():
    names = {a.name for a in ALERTS}
    assert {"GambitKVCacheSaturated", "GambitScorerDown", "GambitTraceThroughputDrop", "GambitHighErrorRate",
            "GambitHighEndToEndLatency"} <= names
    for a in ALERTS:
        r = a.rule()
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["description"]


def test_readme_explains_every_alert():
    from gambit.ops.generate import REPO

    readme = (REPO / "README.md").read_text()
    for a in ALERTS:
        assert f"| `{a.name}` | {a.severity} | {a.for_} |" in readme


def test_contract_names_are_the_services_metrics():
    from gambit.serving.metrics import SPECS

    kinds = {"counter": metrics.COUNTERS, "gauge": metrics.GAUGES, "histogram": metrics.HISTOGRAMS}
    assert {(s.name, s.kind) for s in SPECS} == {(n, k) for k, names in kinds.items() for n in names}


def test_readme_metrics_table_lists_every_metric():
    """Every metric the services export has a row in the README's table ("gambit_traces_active / _ghost"
    names two; a metric added without its row fails here)."""
    import re

    from gambit.ops.generate import REPO
    from gambit.serving.metrics import SPECS

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Metrics"):readme.index("### Benchmark: embedded vs Ray Serve")]
    rows = [ln for ln in section.splitlines() if ln.startswith("| gambit_")]

    def listed(name: str, row: str) -> bool:
        names = re.findall(r"gambit_[a-z0-9_]+", row.split(" | ")[0])
        suffixes = re.findall(r"(?<![a-z0-9])_[a-z0-9_]+", row.split(" | ")[0])
        return name in names or any(name.endswith(x) and any(n.startswith(name[:-len(x)]) for n in names)
                                    for x in suffixes)

    missing = [s.name for s in SPECS if not any(listed(s.name, row) for row in rows)]
    assert not missing, missing


@pytest.mark.parametrize("field, value", [("kv_dtype", "float16"), ("cpu_weights", "int8")])
def test_serve_app_spec_refuses_an_unknown_precision(field, value):
    from gambit.ops.serve_config import ServeAppSpec

    with pytest.raises(ValueError, match=field):
        ServeAppSpec(**{field: value})


@pytest.mark.parametrize("ms", [40000.0, float("nan"), -1.0])
def test_serve_app_spec_refuses_a_batch_wait_the_scorer_replica_would_refuse(ms):
    """Refused before Ray starts (the Scorer replica refused it only once deployed)."""
    from gambit.ops.serve_config import ServeAppSpec

    with pytest.raises(ValueError, match="batch_wait_ms"):
        ServeAppSpec(batch_wait_ms=ms)
    ServeAppSpec(batch_wait_ms=1000.0)


def test_serve_app_spec_refuses_run_defaults_a_coordinator_would_refuse():
    from gambit.ops.serve_config import ServeAppSpec

    with pytest.raises(ValueError, match=r"^max_tokens:"):
        ServeAppSpec(solve_defaults=(("capacity", 8), ("max_tokens", 0)))
    ServeAppSpec(solve_defaults=(("capacity", 1), ("swap", 2)))  # a swap above C is taken as C


def test_serve_env_bounds_the_proxy_and_carries_the_largest_score_request():
    """The proxy took 2 GiB - 1 from anyone before the token check, and its hop to a replica capped at
    4 MiB: a Score call through it over 4 MiB failed INTERNAL. Both names must be ones Ray reads."""
    import inspect
    from pathlib import Path

    import ray.serve._private.constants as ray_constants

    from gambit.ops.serve_env import SERVE_ENV
    from gambit.serving.protos import load
    from gambit.serving.scorer_core import ScorerCore

    pb2, _ = load("scorer")
    rows, width = inspect.signature(ScorerCore).parameters["max_rows"].default, 4096  # an 8B model's width
    assert rows == 4096
    ids = [f"{'r' * 64}:{i}" for i in range(rows)]  # the longest run id (64) and its trace number
    largest = pb2.ScoreRequest(states=bytes(rows * width * 4), dtype="float32", shape=[rows, width],
                               trace_ids=ids, features=[-1.0] * (2 * rows)).ByteSize()
    assert largest > 64 << 20
    text = Path(ray_constants.__file__).read_text()
    for name in ("RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"):
        assert f'"{name}"' in text, f"Ray no longer reads {name}"
        assert largest * 1.5 < int(SERVE_ENV[name]) <= 128 << 20, name  # 1.5: room for forks, drops


def test_serve_app_spec_refuses_a_password_in_its_tree_url():
    """deploy/serve.yaml's app args would carry it: the password comes from GAMBIT_REDIS_PASSWORD."""
    from gambit.ops.serve_config import ServeAppSpec

    with pytest.raises(ValueError, match=r"^tree: redis://.*GAMBIT_REDIS_PASSWORD") as e:
        ServeAppSpec(tree="redis://:s3cret@127.0.0.1:6379/0")
    assert "s3cret" not in str(e.value)
    ServeAppSpec(tree="redis://gambit@127.0.0.1:6379/0")  # an ACL user name alone is fine
