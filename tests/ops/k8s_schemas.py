"""CRD schemas as strict JSON Schemas: unknown fields refused (additionalProperties: false wherever a
schema lists properties and does not already say otherwise)."""

from __future__ import annotations

import copy
from functools import cache

import jsonschema
import pytest
import yaml
from ops_util import CRDS

CRD_FILES = {
    ("ray.io/v1", "RayService"): "ray.io_rayservices.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}


def strict(schema):
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@cache
def crd_schema(api_version: str, kind: str) -> dict:
    path = CRDS / CRD_FILES[(api_version, kind)]
    if not path.is_file():
        pytest.fail(f"CRD schema {path} missing (set GAMBIT_K8S_CRDS to the k8s-crds folder)")
    crd = yaml.safe_load(path.read_text())
    version = api_version.split("/")[1]
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    # apiVersion/kind/metadata are the API server's; metadata stays open as in Kubernetes.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def validate_crd(obj: dict) -> None:
    jsonschema.validate(obj, crd_schema(obj["apiVersion"], obj["kind"]))


def crd_errors(obj: dict) -> list[str]:
    v = jsonschema.Draft7Validator(crd_schema(obj["apiVersion"], obj["kind"]))
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(obj)]
