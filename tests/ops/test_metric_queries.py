"""Every PromQL expression shipped (deploy/prometheus rules, deploy/grafana dashboard) reads metrics the
services export (gambit.serving.metrics.SPECS, built the same by the Ray back-end), used as their type
allows (rate() on counters and histogram parts, histogram_quantile on *_bucket by le, gauges bare) and
grouped or filtered only by labels they carry. Parsed from the generated files, as Prometheus gets them."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from ops_util import REPO

from gambit.serving.metrics import BY_NAME, Spec

RULES = REPO / "deploy" / "prometheus" / "gambit-rules.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "gambit-overview.json"
# Ray Serve's own metrics (REFERENCES.md): none is queried yet; list one here with its labels before using it
RAY_SERVE: dict[str, Spec] = {}
PARTS = ("_bucket", "_sum", "_count")
NAME = re.compile(r"(?<![A-Za-z0-9_:])(ray_|\$\{prefix\})?((?:gambit|serve)_[a-z0-9_]+)")


def rule_exprs() -> list[tuple[str, str, str]]:
    """(where, expr, legend) of every alert rule."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(r["alert"], r["expr"], "") for g in groups for r in g["rules"]]


def panel_exprs() -> list[tuple[str, str, str]]:
    """(where, expr, legend) of every dashboard target."""
    d = json.loads(DASHBOARD.read_text())
    return [(f"{p['title']} {t['refId']}", t["expr"], t.get("legendFormat", ""))
            for p in d["panels"] for t in p.get("targets", [])]


EXPRS = rule_exprs() + panel_exprs()


def resolve(prefix: str | None, name: str) -> tuple[Spec, str]:
    """(spec, part) of an exported name, or AssertionError for one no service exports."""
    if prefix == "ray_" and name.startswith("serve_"):
        spec = RAY_SERVE.get("ray_" + name)
        assert spec is not None, f"ray_{name} is not a Ray Serve metric listed in RAY_SERVE"
        return spec, ""
    assert prefix is not None, f"{name} without the exporter prefix (ray_ / ${{prefix}})"
    for part in PARTS:
        base = name.removesuffix(part)
        if base != name and base in BY_NAME and BY_NAME[base].kind == "histogram":
            return BY_NAME[base], part
    assert name in BY_NAME, f"{name} is not exported (gambit.serving.metrics.SPECS)"
    return BY_NAME[name], ""


def group_end(expr: str, open_at: int) -> int:
    """Index just past the parenthesis group opening at ``open_at``."""
    depth = 0
    for i in range(open_at, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i + 1
    raise AssertionError(f"unbalanced parentheses in {expr!r}")


def matchers(expr: str, at: int) -> tuple[set[str], int]:
    """Label names of the ``{...}`` selector right at ``at`` (if any), and the index past it."""
    if at < len(expr) and expr[at] == "{":
        end = expr.index("}", at) + 1
        return set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", expr[at:end])), end
    return set(), at


def labels_of(spec: Spec, part: str) -> set[str]:
    return set(spec.labels) | ({"le"} if part == "_bucket" else set())


def check_expr(expr: str, legend: str = "") -> list[str]:
    """What is wrong with one expression (empty: nothing)."""
    problems = []
    uses = []  # (start, spec, part)
    for m in NAME.finditer(expr):
        try:
            spec, part = resolve(m.group(1), m.group(2))
        except AssertionError as e:
            problems.append(str(e))
            continue
        name = m.group(0)
        uses.append((m.start(), spec, part))
        in_rate = re.search(r"\b(?:rate|irate|increase)\(\s*$", expr[:m.start()]) is not None
        filters, after = matchers(expr, m.end())
        ranged = expr[after:after + 1] == "["
        if spec.kind == "gauge" and (in_rate or ranged):
            problems.append(f"{name}: a gauge under rate()/a range")
        if spec.kind == "counter" and not in_rate:
            problems.append(f"{name}: a counter read without rate()/increase()")
        if spec.kind == "histogram" and not part:
            problems.append(f"{name}: a histogram is exported as _bucket/_sum/_count only")
        if part and not in_rate:
            problems.append(f"{name}: a histogram part read without rate()/increase()")
        if part == "_bucket" and "histogram_quantile(" not in expr[:m.start()]:
            problems.append(f"{name}: buckets outside histogram_quantile")
        if filters - labels_of(spec, part):
            problems.append(f"{name}: filters on {sorted(filters - labels_of(spec, part))}, not its labels")
    grouped: set[str] = set()
    for m in re.finditer(r"\bby\s*\(([^)]*)\)\s*(?=\()", expr):
        by = {x.strip() for x in m.group(1).split(",") if x.strip()}
        grouped |= by
        end = group_end(expr, m.end())
        for start, spec, part in uses:
            if m.end() <= start < end and by - labels_of(spec, part):
                problems.append(f"{spec.name}{part}: grouped by {sorted(by - labels_of(spec, part))}, "
                                "not its labels")
    for m in re.finditer(r"histogram_quantile\(", expr):
        inner = expr[m.end() - 1:group_end(expr, m.end() - 1)]
        if not re.search(r"\bby\s*\([^)]*\ble\b", inner):
            problems.append(f"histogram_quantile without sum by (le): {inner}")
    missing = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) - grouped
    if missing:
        problems.append(f"legend {legend!r} names {sorted(missing)}, not grouped by")
    return problems


@pytest.mark.parametrize(("where", "expr", "legend"), EXPRS, ids=[e[0] for e in EXPRS])
def test_expression_reads_exported_metrics_as_their_type(where, expr, legend):
    assert check_expr(expr, legend) == []


def test_every_generated_expression_is_checked():
    assert len(rule_exprs()) >= 7 and len(panel_exprs()) >= 30


@pytest.mark.parametrize(("expr", "why"), [
    ("sum(rate(ray_gambit_kv_cache_usage_perc[5m]))", "a gauge under rate"),
    ("sum(ray_gambit_rounds_total)", "without rate"),
    ("sum(rate(ray_gambit_no_such_total[5m]))", "not exported"),
    ("sum(rate(gambit_rounds_total[5m]))", "without the exporter prefix"),
    ("sum by (method) (rate(ray_gambit_generation_tokens_total[5m]))", "grouped by ['method']"),
    ('sum(rate(ray_gambit_request_errors_total{method="x"}[5m]))', "filters on ['method']"),
    ("histogram_quantile(0.9, sum(rate(ray_gambit_e2e_request_latency_seconds_bucket[5m])))",
     "without sum by (le)"),
    ("ray_gambit_e2e_request_latency_seconds_count", "without rate"),
    ("sum(rate(ray_serve_num_http_requests[5m]))", "RAY_SERVE"),
])
def test_checker_catches_misuse(expr, why):
    assert any(why in p for p in check_expr(expr)), check_expr(expr)


def test_checker_catches_a_legend_label_not_grouped_by():
    assert check_expr("sum(rate(ray_gambit_rounds_total[5m]))", "{{method}}")
