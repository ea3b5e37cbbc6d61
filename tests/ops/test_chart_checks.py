"""The chart against the operations review (walk-ops): the gRPC Service follows the serving RayCluster,
values that could never schedule or that clash are refused with one line, explicit replica counts win,
Target autoscaling is real, every map is rendered once, and the schema is as strict as Kubernetes."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from ops_util import CHART, CI_VALUES, by_kind, render, run


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key twice in one map (Helm and kubectl keep the later one silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = set()
    for k, _ in node.value:
        key = loader.construct_object(k, deep=deep)
        if key in seen:
            raise ValueError(f"duplicate key {key!r} at line {k.start_mark.line + 1}")
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def _template(helm, *args: str):
    return run([helm, "template", "gambit", str(CHART), "--namespace", "serving", *args])


def _sets(*settings: str) -> list[str]:
    return [a for s in settings for a in (("--set-json", s[5:]) if s.startswith("json:") else ("--set", s))]


def _rayservice(docs):
    (rs,) = by_kind(docs, "RayService")
    return rs


def _deployments(rs) -> dict[str, dict]:
    cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    return {d["name"]: d for a in cfg["applications"] for d in a["deployments"]}


def _gambit_args(rs) -> dict:
    cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    return next(a for a in cfg["applications"] if a["name"] == "gambit")["args"]


def _groups(rs):
    return {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


# --- the gRPC Service is KubeRay's serve Service, so it follows the active cluster

def test_grpc_service_is_declared_through_the_rayservice(helm):
    """A Service of the chart selected pods of the old and the new RayCluster during a NewCluster upgrade;
    KubeRay owns spec.serveService's selector (ray.io/cluster of the serving cluster) and switches it."""
    docs = render(helm, "--set", "grpcService.port=50051", "--set", "grpcService.type=LoadBalancer",
                  "--set", "grpcService.annotations.team=search", "--set", "serve.tokenSecret=gambit-token")
    assert not [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-grpc")]
    rs = _rayservice(docs)
    svc = rs["spec"]["serveService"]
    assert svc["metadata"]["name"] == "gambit-grpc"  # the name NOTES and the README give backends
    assert svc["metadata"]["annotations"] == {"team": "search"}
    assert "selector" not in svc["spec"]  # KubeRay's own, pointing at one cluster
    assert svc["spec"]["type"] == "LoadBalancer"
    (port,) = svc["spec"]["ports"]
    assert port == {"name": "serve-grpc", "port": 50051, "targetPort": "serve-grpc", "protocol": "TCP",
                    "appProtocol": "grpc"}
    # KubeRay (>= 1.6) keeps a user port whose name matches a serve* port of the head container
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"containerPort": 9000, "name": "serve-grpc"} in head["ports"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Service", **copy.deepcopy(svc)}, "1.30.0",
                                 strict=True)


def test_docs_name_the_kuberay_version_that_keeps_the_grpc_port():
    from ops_util import REPO

    readme = (REPO / "README.md").read_text()
    assert "KubeRay operator** (≥ 1.6" in readme and "≥ 1.3" not in readme
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["annotations"]["gambit/kuberay-operator-version"] == ">=1.6.0"


# --- values that cannot work are refused with one line

@pytest.mark.parametrize("settings, message", [
    (("cpuWorkers.replicas=0", "cpuWorkers.minReplicas=0"),
     "cpuWorkers.replicas: 0 CPU workers with autoscaling.enabled false"),
    (("serve.deployments.Target.numGpus=2",),
     "serve.deployments.Target.numGpus: 2 is above gpuWorkers.gpusPerWorker 1"),
    (("serve.deployments.Target.numReplicas=8",),
     "serve.deployments.Target: up to 8 replicas, but 1 GPU worker(s) (gpuWorkers.replicas) hold 1"),
    (("json:serve.deployments.Target.numGpus=0.5", "serve.deployments.Target.numReplicas=3"),
     "up to 3 replicas, but 1 GPU worker(s) (gpuWorkers.replicas) hold 2"),
    (("serve.grpcPort=8000",), "serve.httpPort: 8000 is also serve.grpcPort"),
    (("monitoring.metricsPort=9000",), "monitoring.metricsPort: 9000 is also serve.grpcPort"),
    (("monitoring.metricsPort=8000",), "monitoring.metricsPort: 8000 is also serve.httpPort"),
    (("serve.httpPort=6379",), "serve.httpPort: 6379 is a port Ray itself uses"),
    (("serve.grpcPort=52365",), "serve.grpcPort: 52365 is a port Ray itself uses"),
    (("monitoring.metricsPort=8265",), "monitoring.metricsPort: 8265 is a port Ray itself uses"),
    (("serve.httpPort=10001",), "serve.httpPort: 10001 is a port Ray itself uses"),
    # the CPU group must hold the Coordinator and the Scorer at its max_replicas
    (("cpuWorkers.resources.limits.cpu=4",),
     "cpuWorkers: the Coordinator and Scorer need up to 5 CPUs (replicas x numCpus), but 1 CPU worker(s)"),
    (("serve.deployments.Scorer.numReplicas=5",), "cpuWorkers: the Coordinator and Scorer need up to 6 CPUs"),
    (("serve.deployments.Target.numCpus=9",), "serve.deployments.Target: up to 1 replicas x numCpus 9"),
    (("json:serve.deployments.Scorer.autoscaling={\"min_replicas\":3,\"max_replicas\":2}",),
     "serve.deployments.Scorer.autoscaling: min_replicas 3 is above max_replicas 2"),
    (("serve.scorer=sequence", "serve.deployments.Scorer.numReplicas=2"),
     "serve.deployments.Scorer.numReplicas: 2, but serve.scorer \"sequence\" keeps each trace's history"),
    # names, env and group names
    (("serve.extraEnv.GAMBIT_REDIS_PASSWORD=x",), "serve.extraEnv.GAMBIT_REDIS_PASSWORD: set by the chart"),
    (("serve.tokenSecret=tok", "serve.extraEnv.GAMBIT_TOKEN=x"),
     "serve.extraEnv.GAMBIT_TOKEN: set by the chart from serve.tokenSecret"),
    (("serve.tokenEnv=GAMBIT_REDIS_PASSWORD",),
     "serve.tokenEnv: GAMBIT_REDIS_PASSWORD holds the Redis password"),
    (("cpuWorkers.groupName=gpu-workers",),
     "cpuWorkers.groupName: \"gpu-workers\" is also gpuWorkers.groupName"),
    # a Service outside the cluster answers anyone: only with a token, or when asked
    (("grpcService.type=LoadBalancer",),
     "grpcService.type: LoadBalancer exposes the ReasoningService with no bearer token (serve.tokenSecret"),
    (("grpcService.type=NodePort", "grpcService.allowUnauthenticated=false"),
     "set serve.tokenSecret to a Secret with key `token`, or grpcService.allowUnauthenticated=true"),
])
def test_values_that_cannot_work_are_refused_in_one_line(helm, settings, message):
    r = _template(helm, *_sets(*settings))
    assert r.returncode != 0 and message in r.stderr, r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if message in ln]
    assert line.startswith("Error: execution error")


def test_an_invalid_release_name_is_refused(helm):
    r = run([helm, "template", "1st", str(CHART)])  # Helm takes it; "1st-gambit" is no Service name
    assert r.returncode != 0 and 'fullnameOverride (or the release name): "1st-gambit"' in r.stderr, r.stderr


def test_autoscaling_leaves_room_for_what_the_groups_can_grow_to(helm):
    """With Ray's autoscaler on, the limits are maxReplicas, not replicas."""
    docs = render(helm, *_sets("autoscaling.enabled=true", "gpuWorkers.maxReplicas=3",
                               "serve.deployments.Target.numReplicas=3"))
    assert _deployments(_rayservice(docs))["Target"]["num_replicas"] == 3
    r = _template(helm, *_sets("autoscaling.enabled=true", "gpuWorkers.maxReplicas=3",
                               "serve.deployments.Target.numReplicas=4"))
    assert "up to 4 replicas, but 3 GPU worker(s) (gpuWorkers.maxReplicas) hold 3" in r.stderr, r.stderr


# --- an explicit numReplicas wins; Target autoscaling is rendered

def test_an_explicit_num_replicas_wins_over_the_default_autoscaling(helm):
    deps = _deployments(_rayservice(render(helm, "--set", "serve.deployments.Scorer.numReplicas=2")))
    # null, not absent: the Scorer's code autoscales 1-2 and Serve keeps that under a bare num_replicas
    # (tests/deployments/test_app_replicas.py shows what Serve makes of each)
    assert deps["Scorer"]["num_replicas"] == 2 and deps["Scorer"]["autoscaling_config"] is None
    # a sequence scorer stays at one replica, whatever the autoscaling block says
    deps = _deployments(_rayservice(render(helm, "--set", "serve.scorer=sequence")))
    assert deps["Scorer"]["num_replicas"] == 1 and "autoscaling_config" not in deps["Scorer"]
    # the Coordinator autoscales when given a block (its numReplicas defaults to null)
    rs = _rayservice(render(helm, "--set-json",  # 2 Coordinators + 4 Scorers: a second CPU worker
                            'serve.deployments.Coordinator.autoscaling={"min_replicas":1,"max_replicas":2}',
                            "--set", "cpuWorkers.replicas=2"))
    assert _deployments(rs)["Coordinator"]["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 2}
    assert "num_replicas" not in _deployments(rs)["Coordinator"]
    assert _gambit_args(rs)["coordinator_replicas"] == 2


def test_target_autoscaling_is_rendered_and_bounded_by_the_gpu_workers(helm):
    from ray.serve.schema import ServeDeploySchema

    multi = next(f for f in CI_VALUES if f.stem == "multi-gpu-values")
    rs = _rayservice(render(helm, "-f", str(multi)))
    target = _deployments(rs)["Target"]
    assert "num_replicas" not in target
    assert target["autoscaling_config"]["max_replicas"] == 12  # gpuWorkers.maxReplicas 6 x 2 GPUs
    assert _gambit_args(rs)["target_replicas"] == 12  # the Coordinator may try a run on any of them
    ServeDeploySchema.model_validate(yaml.safe_load(rs["spec"]["serveConfigV2"]))
    r = _template(helm, "-f", str(multi), "--set", "serve.deployments.Target.autoscaling.max_replicas=13")
    assert "up to 13 replicas, but 6 GPU worker(s) (gpuWorkers.maxReplicas) hold 12" in r.stderr, r.stderr
    # an explicit numReplicas wins here too
    rs = _rayservice(render(helm, "-f", str(multi), "--set", "serve.deployments.Target.numReplicas=6"))
    assert _deployments(rs)["Target"]["num_replicas"] == 6 and _gambit_args(rs)["target_replicas"] == 6


# --- each map once

def test_every_rendered_map_has_each_key_once(helm, tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({
        "head": {"rayStartParams": {"object-store-memory": "100000000"}},
        "gpuWorkers": {"rayStartParams": {"object-store-memory": "200000000"},
                       "resources": {"requests": {"cpu": "4", "ephemeral-storage": "10Gi"},
                                     "limits": {"cpu": "8", "ephemeral-storage": "20Gi"}}},
        "cpuWorkers": {"rayStartParams": {"num-cpus": "6"}},
    }))
    for args in ([], *(["-f", str(f)] for f in CI_VALUES), ["-f", str(extra)]):
        r = _template(helm, *args)
        assert r.returncode == 0, r.stderr
        docs = [d for d in yaml.load_all(r.stdout, Loader=_StrictLoader) if d]
    rs = _rayservice(docs)  # the last: the extra keys joined the chart's
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
    assert head == {"num-cpus": "0", "dashboard-host": "0.0.0.0", "metrics-export-port": "8080",
                    "object-store-memory": "100000000"}
    gpu, cpu = _groups(rs)["gpu-workers"], _groups(rs)["cpu-workers"]
    assert gpu["rayStartParams"] == {"num-gpus": "1", "metrics-export-port": "8080",
                                     "object-store-memory": "200000000"}
    assert gpu["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "4", "memory": "24Gi", "ephemeral-storage": "10Gi", "nvidia.com/gpu": 1},
        "limits": {"cpu": "8", "memory": "48Gi", "ephemeral-storage": "20Gi", "nvidia.com/gpu": 1}}
    params = cpu["rayStartParams"]
    assert params["num-cpus"] == "6" and "gambit_cpu_worker" in params["resources"]


@pytest.mark.parametrize("settings, message", [
    (("head.rayStartParams.num-cpus=2",), "head.rayStartParams.num-cpus: set by the chart"),
    (("head.rayStartParams.metrics-export-port=9090",),
     "head.rayStartParams.metrics-export-port: set by the chart (set monitoring.metricsPort)"),
    (("gpuWorkers.rayStartParams.num-gpus=2",),
     "gpuWorkers.rayStartParams.num-gpus: set by the chart (set gpuWorkers.gpusPerWorker)"),
    (("cpuWorkers.rayStartParams.resources=x",), "cpuWorkers.rayStartParams.resources: set by the chart"),
    (("gpuWorkers.resources.requests.nvidia\\.com/gpu=2",),
     "gpuWorkers.resources.requests.nvidia.com/gpu: set by the chart; set gpuWorkers.gpusPerWorker instead"),
    (("gpuWorkers.resources.limits.nvidia\\.com/gpu=2",), "gpuWorkers.resources.limits.nvidia.com/gpu"),
])
def test_keys_the_chart_sets_are_refused_not_duplicated(helm, settings, message):
    r = _template(helm, *[a for s in settings for a in ("--set-string", s)])
    assert r.returncode != 0 and message in r.stderr, r.stderr


# --- fractional numGpus

@pytest.mark.parametrize("gpus, per_worker, workers, want", [
    (0.5, 1, 1, 2), (0.3, 1, 1, 3), (0.1, 1, 1, 10), (0.5, 2, 2, 8), (1.5, 2, 1, 1), (2, 2, 3, 3),
    (0, 1, 1, 1),
    (0.14, 7, 1, 50),  # 7 / 0.14 is 49.99999999999999 in floats
])
def test_target_replicas_follow_the_gpu_slots(helm, gpus, per_worker, workers, want):
    """floor(gpusPerWorker / numGpus) x replicas, as values.yaml and the README say (ceil gave half)."""
    docs = render(helm, "--set-json", f"serve.deployments.Target.numGpus={gpus}",
                  "--set-json", "serve.deployments.Target.numCpus=0.1",  # 50 of them on 8 CPUs
                  *_sets(f"gpuWorkers.gpusPerWorker={per_worker}", f"gpuWorkers.replicas={workers}",
                         f"gpuWorkers.maxReplicas={workers}"))
    rs = _rayservice(docs)
    assert _deployments(rs)["Target"]["num_replicas"] == want
    assert _gambit_args(rs)["target_replicas"] == want


# --- the schema

@pytest.mark.parametrize("setting, field", [
    ("head.resources.requests.cpu=1.2.3", "head.resources.requests.cpu"),
    ("head.resources.requests.memory=5Gb", "head.resources.requests.memory"),
    ("redis.resources.limits.memory=1GB", "redis.resources.limits.memory"),
    ("gpuWorkers.replicas=99999999999", "gpuWorkers.replicas"),
    ("cpuWorkers.maxReplicas=2147483648", "cpuWorkers.maxReplicas"),
    ("serve.deployments.Target.numReplicas=2147483648", "serve.deployments.Target.numReplicas"),
    ("fullnameOverride=My_Gambit", "fullnameOverride"),
])
def test_the_schema_refuses_what_kubernetes_would(helm, setting, field):
    flag = "--set-string" if "resources" in setting or "Override" in setting else "--set"
    r = _template(helm, flag, setting)
    assert r.returncode != 0 and "values don't meet the specifications of the schema" in r.stderr
    assert f"- {field}:" in r.stderr, r.stderr


@pytest.mark.parametrize("quantity", ["500m", "1.5", "2", "4Gi", "1e3", "128974848", ".5"])
def test_kubernetes_quantities_pass_the_schema(helm, quantity):
    r = _template(helm, "--set-string", f"head.resources.requests.cpu={quantity}")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, image", [
    (("--set", "image.tag=2"), "gambit:2"),
    (("--set", "image.tag=v1.2"), "gambit:v1.2"),
    ((), "gambit:0.1.0"),
])
def test_a_numeric_image_tag_is_rendered_as_its_digits(helm, tmp_path, args, image):
    head = _rayservice(render(helm, *args))["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["image"] == image
    values = tmp_path / "tag.yaml"
    values.write_text("image:\n  tag: 20240101\n")  # Helm reads it as a float: not 2.0240101e+07
    head = _rayservice(render(helm, "-f", str(values)))["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["template"]["spec"]["containers"][0]["image"] == "gambit:20240101"
