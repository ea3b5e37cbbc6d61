"""What an operator deploying the chart on a GPU cluster expects of its pods: non-root with no privileges,
placement and priority per group, no API token where nothing calls the API, an optional NetworkPolicy that
keeps Redis to the Ray pods, stable pod labels, and values that refuse typos."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
from ops_util import CHART, by_kind, render, run

K8S_VERSION = "1.30.0"
COMPONENTS = {"head", "gpu-worker", "cpu-worker"}


def _ray_pods(docs) -> dict[str, dict]:
    """Component -> the Ray pod template (metadata and spec) KubeRay creates that group's pods from."""
    (rs,) = by_kind(docs, "RayService")
    cluster = rs["spec"]["rayClusterConfig"]
    out = {"head": cluster["headGroupSpec"]["template"]}
    for g in cluster["workerGroupSpecs"]:
        out[g["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = g["template"]
    return out


def _all_pods(docs) -> dict[str, dict]:
    out = _ray_pods(docs)
    for sts in by_kind(docs, "StatefulSet"):
        out["redis"] = sts["spec"]["template"]
    return out


def _as_pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]},
            "spec": template["spec"]}


@pytest.mark.parametrize("variant", ["default", "multi-gpu-values"])
def test_every_pod_runs_non_root_without_privileges(rendered, variant):
    pods = _all_pods(rendered[variant])
    assert set(pods) == COMPONENTS | {"redis"}
    for name, pod in pods.items():
        sc = pod["spec"]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert sc["runAsUser"] == (999 if name == "redis" else 1000)  # the images' own users
        # and groups: rayproject/ray's "users" (100); redis:*-alpine's "redis" is 1000 (999 is alpine's
        # "ping"), and the PVC's group (fsGroup) is the one Redis runs as, so /data stays writable
        assert sc["runAsGroup"] == sc["fsGroup"] == (1000 if name == "redis" else 100), name
        for c in pod["spec"]["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], name
        kubernetes_validate.validate(_as_pod(pod), K8S_VERSION, strict=True)
    assert pods["redis"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_security_contexts_are_settable_and_refuse_typos(helm):
    docs = render(helm, "--set", "podSecurityContext.runAsUser=2000",
                  "--set", "redis.podSecurityContext.fsGroup=7",
                  "--set", "securityContext.readOnlyRootFilesystem=true")
    pods = _all_pods(docs)
    assert {pods[c]["spec"]["securityContext"]["runAsUser"] for c in COMPONENTS} == {2000}
    assert pods["redis"]["spec"]["securityContext"]["fsGroup"] == 7
    for c in COMPONENTS:
        assert pods[c]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    r = run([helm, "template", "g", str(CHART), "--set", "securityContext.allowPrivilegeEscalaton=false"])
    assert r.returncode != 0 and "- securityContext:" in r.stderr, r.stderr
    r = run([helm, "template", "g", str(CHART), "--set", "redis.podSecurityContext.runAsUser=-1"])
    assert r.returncode != 0 and "- redis.podSecurityContext.runAsUser:" in r.stderr, r.stderr


@pytest.mark.parametrize("variant", ["default", "multi-gpu-values", "external-redis-values"])
def test_every_container_has_requests_and_limits_and_ray_leaves_probes_to_kuberay(rendered, variant):
    for name, pod in _all_pods(rendered[variant]).items():
        for c in pod["spec"]["containers"]:
            assert c["resources"]["requests"] and c["resources"]["limits"], (name, c["name"])
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), (name, c["name"])
            if name != "redis":  # KubeRay adds its own probes where the chart sets none
                assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(c), name
    gpu = _ray_pods(rendered[variant])["gpu-worker"]["spec"]["containers"][0]["resources"]
    assert gpu["requests"]["nvidia.com/gpu"] == gpu["limits"]["nvidia.com/gpu"] >= 1


def test_placement_and_priority_per_group(helm, rendered):
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}]
    own = [{**spread[0], "labelSelector": {"matchLabels": {"tier": "x"}}}]
    args = []
    for group in ("head", "gpuWorkers", "cpuWorkers", "redis"):
        args += ["--set", f"{group}.priorityClassName={group.lower()}-prio",
                 "--set-json", f"{group}.topologySpreadConstraints={json.dumps(spread)}"]
    args += ["--set-json", f"cpuWorkers.topologySpreadConstraints={json.dumps(own)}",
             "--set", "redis.nodeSelector.pool=system",
             "--set-json", 'redis.tolerations=[{"key": "system", "operator": "Exists"}]']
    pods = _all_pods(render(helm, *args))
    names = {"head": "head", "gpu-worker": "gpuworkers", "cpu-worker": "cpuworkers", "redis": "redis"}
    for component, pod in pods.items():
        assert pod["spec"]["priorityClassName"] == f"{names[component]}-prio"
        (tsc,) = pod["spec"]["topologySpreadConstraints"]
        if component == "cpu-worker":  # a labelSelector given is kept as is
            assert tsc == own[0]
        else:  # none given: the pod's own labels, so the spread counts this group's pods only
            assert tsc["labelSelector"]["matchLabels"] == pod["metadata"]["labels"]
        kubernetes_validate.validate(_as_pod(pod), K8S_VERSION, strict=True)
    assert pods["redis"]["spec"]["nodeSelector"] == {"pool": "system"}
    assert pods["redis"]["spec"]["tolerations"] == [{"key": "system", "operator": "Exists"}]
    multi = _ray_pods(rendered["multi-gpu-values"])["gpu-worker"]["spec"]
    assert multi["priorityClassName"] == "gambit-gpu"
    selector = multi["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]
    assert selector["app.kubernetes.io/component"] == "gpu-worker"
    r = run([helm, "template", "g", str(CHART), "--set-json",
             'gpuWorkers.topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone"}]'])
    assert r.returncode != 0 and "- gpuWorkers.topologySpreadConstraints.0:" in r.stderr, r.stderr


@pytest.mark.parametrize("autoscaling", [False, True])
def test_api_token_is_mounted_only_where_the_autoscaler_needs_it(helm, autoscaling):
    docs = render(helm, "--set", f"autoscaling.enabled={str(autoscaling).lower()}")
    mounts = {c: p["spec"]["automountServiceAccountToken"] for c, p in _all_pods(docs).items()}
    assert mounts == {"head": autoscaling, "gpu-worker": False, "cpu-worker": False, "redis": False}
    docs = render(helm, "--set", "serviceAccount.name=gambit-ray",
                  "--set", "serviceAccount.automountToken=true")
    for pod in _ray_pods(docs).values():
        assert pod["spec"]["serviceAccountName"] == "gambit-ray"
        assert pod["spec"]["automountServiceAccountToken"] is True


def test_network_policy_is_off_by_default_and_keeps_redis_to_ray(rendered, helm):
    assert not by_kind(rendered["default"], "NetworkPolicy")
    docs = render(helm, "--set", "networkPolicy.enabled=true")
    pols = {p["metadata"]["name"]: p for p in by_kind(docs, "NetworkPolicy")}
    assert set(pols) == {"gambit-ray", "gambit-redis"}
    for p in pols.values():
        kubernetes_validate.validate(p, K8S_VERSION, strict=True)
        assert p["spec"]["policyTypes"] == ["Ingress"]
    pods = _all_pods(docs)

    def selects(selector: dict, labels: dict) -> bool:
        ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
        return ok and all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))

    redis = pols["gambit-redis"]["spec"]
    assert [c for c, p in pods.items() if selects(redis["podSelector"], p["metadata"]["labels"])] == ["redis"]
    (rule,) = redis["ingress"]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    (peer,) = rule["from"]
    assert {c for c, p in pods.items() if selects(peer["podSelector"], p["metadata"]["labels"])} == COMPONENTS
    ray = pols["gambit-ray"]["spec"]
    assert {c for c, p in pods.items() if selects(ray["podSelector"], p["metadata"]["labels"])} == COMPONENTS
    open_ports = {p["port"] for r in ray["ingress"] if "from" not in r for p in r["ports"]}
    assert open_ports == {"serve-grpc", "metrics"}  # from anywhere by default; nothing else is
    (op,) = [r for r in ray["ingress"] if any(p["port"] == 8265 for p in r.get("ports", []))]
    assert op["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
    # the ports named exist on every Ray container
    for c in COMPONENTS:
        assert {"serve-grpc", "metrics"} <= {p["name"] for p in pods[c]["spec"]["containers"][0]["ports"]}
    multi = {p["metadata"]["name"]: p for p in by_kind(rendered["multi-gpu-values"], "NetworkPolicy")}
    (grpc,) = [r for r in multi["gambit-ray"]["spec"]["ingress"] if r.get("ports", [{}])[0].get("port")
               == "serve-grpc"]
    assert grpc["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "web"}}}]
    ext = render(helm, "--set", "networkPolicy.enabled=true", "--set", "redis.mode=external",
                 "--set", "redis.external.url=redis://r:6379/0")
    assert [p["metadata"]["name"] for p in by_kind(ext, "NetworkPolicy")] == ["gambit-ray"]
    r = run([helm, "template", "g", str(CHART), "--set", "networkPolicy.grpcform=x"])
    assert r.returncode != 0 and "- networkPolicy:" in r.stderr, r.stderr


def test_every_object_has_the_recommended_labels_and_pods_none_that_change_on_upgrade(helm):
    docs = render(helm, "--set", "networkPolicy.enabled=true", "--set", "commonLabels.team=search")
    for d in docs:
        labels = d["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                    "app.kubernetes.io/managed-by", "helm.sh/chart"):
            assert key in labels, (d["kind"], key)
        assert labels["team"] == "search", d["kind"]
    for c, pod in _all_pods(docs).items():  # a chart upgrade must not restart (or rebuild) the Ray cluster
        assert pod["metadata"]["labels"] == {"app.kubernetes.io/name": "gambit",
                                             "app.kubernetes.io/instance": "gambit",
                                             "app.kubernetes.io/component": c}


@pytest.mark.parametrize("key", ["app.kubernetes.io/name", "app.kubernetes.io/component", "helm.sh/chart"])
def test_common_labels_may_not_replace_the_charts_own(helm, key):
    """A commonLabels key the chart sets was rendered twice in metadata.labels (the last one winning)."""
    r = run([helm, "template", "g", str(CHART), "--set", f"commonLabels.{key.replace('.', chr(92) + '.')}=x"])
    assert r.returncode != 0 and f"commonLabels.{key}: set by the chart" in r.stderr, r.stderr
    r = run([helm, "template", "g", str(CHART), "--set", "commonLabels.app\\.kubernetes\\.io/part-of=search"])
    assert r.returncode == 0, r.stderr


def test_notes_say_what_the_network_policy_lets_in(helm, tmp_path):
    from test_chart import _notes

    assert "NetworkPolicies" not in _notes(helm, tmp_path)
    notes = _notes(helm, tmp_path, "--set", "networkPolicy.enabled=true", "--set", "rayAuth.mode=disabled")
    assert "NetworkPolicies g-gambit-ray and g-gambit-redis are on" in notes
    assert "the gRPC port takes anyone" in notes
    assert "or networkPolicy.enabled=true" not in notes  # already on: not suggested
    assert "or networkPolicy.enabled=true" in _notes(helm, tmp_path, "--set", "rayAuth.mode=disabled")
