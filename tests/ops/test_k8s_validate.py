"""Rendered objects against real schemas: kubernetes-validate for core kinds, the CRDs' own
openAPIV3Schema (made strict: unknown fields refused) for RayService, PodMonitor, PrometheusRule."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from k8s_schemas import CRD_FILES, crd_errors

K8S_VERSION = "1.30.0"
VARIANTS = ["default", "one-gpu-values", "multi-gpu-values", "external-redis-values", "no-monitoring-values"]


def _serve_service(docs) -> dict:
    """The RayService's serveService as the Service object KubeRay creates from it."""
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    return {"apiVersion": "v1", "kind": "Service", **copy.deepcopy(rs["spec"]["serveService"])}


@pytest.mark.parametrize("variant", VARIANTS)
def test_core_kinds_validate(rendered, variant):
    core = [d for d in rendered[variant] if (d["apiVersion"], d["kind"]) not in CRD_FILES]
    core.append(_serve_service(rendered[variant]))  # the gRPC Service, which KubeRay creates from it
    assert {d["kind"] for d in core} >= {"Service", "Secret", "PodDisruptionBudget"}
    for d in core:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_custom_resources_validate_against_strict_crd_schemas(rendered, variant):
    crs = [d for d in rendered[variant] if (d["apiVersion"], d["kind"]) in CRD_FILES]
    kinds = {d["kind"] for d in crs}
    assert kinds == ({"RayService"} if variant == "no-monitoring-values"
                     else {"RayService", "PodMonitor", "PrometheusRule"})
    for d in crs:
        assert crd_errors(d) == [], d["kind"]


def test_strict_schemas_catch_typos(rendered):
    (rs,) = [d for d in rendered["default"] if d["kind"] == "RayService"]
    bad = copy.deepcopy(rs)
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["replica"] = 2  # typo of replicas
    assert any("'replica' was unexpected" in e for e in crd_errors(bad))
    bad = copy.deepcopy(rs)
    head = bad["spec"]["rayClusterConfig"]["headGroupSpec"]
    head["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert any("imagePullPolicy" in e for e in crd_errors(bad))
    (pm,) = [d for d in rendered["default"] if d["kind"] == "PodMonitor"]
    bad = copy.deepcopy(pm)
    bad["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    assert any("'intervall' was unexpected" in e for e in crd_errors(bad))


def test_kubernetes_validate_catches_typos(rendered):
    svc = _serve_service(rendered["default"])
    assert svc["metadata"]["name"] == "gambit-grpc"
    bad = copy.deepcopy(svc)
    bad["spec"]["ports"][0]["prot"] = 9000
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
