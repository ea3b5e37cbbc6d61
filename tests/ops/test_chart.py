"""The Helm chart, checked offline with the real Helm CLI: lint, render every ci/ values file, and the
properties the issue asks of the rendered objects."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from ops_util import CHART, CI_VALUES, by_kind, run

from gambit.ops.dashboards import dashboard_json
from gambit.ops.generate import REPO


def _rayservice(docs):
    (rs,) = by_kind(docs, "RayService")
    return rs


def _groups(rs):
    return {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


def test_ci_values_cover_the_variants():
    assert {f.stem for f in CI_VALUES} == {"one-gpu-values", "multi-gpu-values", "external-redis-values",
                                            "no-monitoring-values"}


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.stem if v else "default")
def test_helm_lint_strict(helm, values):
    r = run([helm, "lint", "--strict", str(CHART), *(["-f", str(values)] if values else [])])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


def test_no_remote_dependencies():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert not chart.get("dependencies")
    assert not (CHART / "charts").exists() and not (CHART / "Chart.lock").exists()


def test_head_takes_no_work_and_gpu_group_from_values(rendered):
    rs = _rayservice(rendered["multi-gpu-values"])
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    groups = _groups(rs)
    gpu = groups["gpu-workers"]
    assert (gpu["replicas"], gpu["minReplicas"], gpu["maxReplicas"]) == (4, 2, 6)
    spec = gpu["template"]["spec"]
    (c,) = spec["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "g6.12xlarge"}
    want = {"key": "dedicated", "operator": "Equal", "value": "gambit", "effect": "NoSchedule"}
    assert want in spec["tolerations"]
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert rs["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}  # Ray 2.60's default
    assert rs["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    cpu = groups["cpu-workers"]
    assert "nvidia.com/gpu" not in json.dumps(cpu)
    assert json.loads(yaml.safe_load(cpu["rayStartParams"]["resources"])) == {"gambit_cpu_worker": 1000}


def _deployments(cfg: dict) -> dict[str, dict]:
    return {d["name"]: d for a in cfg["applications"] for d in a["deployments"]}


def test_serve_config_matches_the_generated_one_and_scales_with_gpus(rendered):
    cfg = yaml.safe_load(_rayservice(rendered["default"])["spec"]["serveConfigV2"])
    want = yaml.safe_load((REPO / "deploy" / "serve-kubernetes.yaml").read_text())
    (gambit,) = [a for a in cfg["applications"] if a["name"] == "gambit"]
    assert gambit["args"]["tree"] == "redis://gambit-redis.serving.svc:6379/0"  # the release's Redis
    gambit["args"]["tree"] = want["applications"][0]["args"]["tree"]
    assert cfg == want
    multi = yaml.safe_load(_rayservice(rendered["multi-gpu-values"])["spec"]["serveConfigV2"])
    deps = _deployments(multi)
    reps = {name: d.get("num_replicas") for name, d in deps.items()}
    assert reps == {"Target": None, "Scorer": None, "Coordinator": 2}  # Targets and Scorers autoscale
    assert deps["Scorer"]["autoscaling_config"] == {  # the values file's block merges into the default's
        "min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 8, "upscale_delay_s": 5,
        "downscale_delay_s": 60,
        "policy": {"policy_function": "gambit.deployments.scorer_autoscaling:scorer_autoscaling_policy"}}
    # 4 workers x 2 GPUs at start; Serve moves the Targets between 2 and 6 workers' worth, Ray follows
    target = deps["Target"]["autoscaling_config"]
    assert (target["min_replicas"], target["initial_replicas"], target["max_replicas"]) == (4, 8, 12)
    (gambit,) = [a for a in multi["applications"] if a["name"] == "gambit"]
    assert (gambit["args"]["target_replicas"], gambit["args"]["coordinator_replicas"]) == (12, 2)


def test_target_precision_and_drafter_settings_reach_the_target(helm):
    import inspect

    from gambit.deployments.target import Target

    r = run([helm, "template", "g", str(CHART), "--set", "serve.kvDtype=bfloat16",
             "--set", "serve.cpuWeights=bfloat16", "--set", "serve.batchInvariant=true",
             "--set", "serve.drafters=pr=/models/m-pr"])
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(_rayservice(list(yaml.safe_load_all(r.stdout)))["spec"]["serveConfigV2"])
    (gambit,) = [a for a in cfg["applications"] if a["name"] == "gambit"]
    target = gambit["args"]["target"]
    got = (target["kv_dtype"], target["cpu_weights"], target["batch_invariant"], target["drafters"])
    assert got == ("bfloat16", "bfloat16", True, "pr=/models/m-pr")
    params = inspect.signature(Target.func_or_class.__init__).parameters
    assert set(target) <= set(params), set(target) - set(params)  # build_gambit passes them as kwargs


def test_chart_gives_the_scorer_the_targets_model_so_its_width_follows(helm):
    import inspect

    """serve.model set alone: the Scorer reads the model's width (hiddenSize 0), where a forgotten
    hiddenSize: 192 made every Score call of a wider model fail over to the fallback."""
    from gambit.deployments.scorer import Scorer

    r = run([helm, "template", "g", str(CHART), "--set", "serve.model=/models/smollm2"])
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(_rayservice(list(yaml.safe_load_all(r.stdout)))["spec"]["serveConfigV2"])
    (scorer,) = [a for a in cfg["applications"] if a["name"] == "scorer"]
    assert scorer["args"]["model"] == "/models/smollm2" and scorer["args"]["hidden_size"] == 0
    params = inspect.signature(Scorer.func_or_class.__init__).parameters
    assert set(scorer["args"]) <= set(params), set(scorer["args"]) - set(params)


@pytest.mark.parametrize("variant", ["default", "one-gpu-values", "multi-gpu-values", "external-redis-values",
                                     "no-monitoring-values"])
def test_serve_config_passes_serve_deploy_schema(rendered, variant):
    from ray.serve.schema import ServeDeploySchema

    cfg = yaml.safe_load(_rayservice(rendered[variant])["spec"]["serveConfigV2"])
    schema = ServeDeploySchema.model_validate(cfg)
    assert schema.grpc_options.port == 9000
    assert [a.name for a in schema.applications] == ["gambit", "scorer"]


def test_grpc_service_port_named_as_kuberay_requires(rendered):
    docs = rendered["default"]
    rs = _rayservice(docs)
    svc = rs["spec"]["serveService"]  # KubeRay builds the Service from it (see test_chart_checks)
    assert svc["metadata"]["name"] == "gambit-grpc"
    (port,) = svc["spec"]["ports"]
    assert port["name"].startswith("serve-") and port["targetPort"] == port["name"] and port["port"] == 9000
    containers = [rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]]
    containers += [g["template"]["spec"]["containers"][0] for g in _groups(rs).values()]
    for c in containers:
        assert {"containerPort": 9000, "name": port["name"]} in c["ports"]


def test_internal_redis_has_aof_volume_and_password_secret(rendered):
    docs = rendered["default"]
    (sts,) = by_kind(docs, "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert "--appendonly yes" in c["args"][0] and "--requirepass" in c["args"][0]
    assert c["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi"
    (secret,) = by_kind(docs, "Secret")
    assert len(secret["stringData"]["redis-password"]) == 32
    name = secret["metadata"]["name"]
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": name, "key": "redis-password"}
    head = _rayservice(docs)["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    ref = {"name": name, "key": "redis-password", "optional": True}
    want = {"name": "GAMBIT_REDIS_PASSWORD", "valueFrom": {"secretKeyRef": ref}}
    assert want in head["containers"][0]["env"]


def _ray_containers(rs) -> dict[str, dict]:
    """Group name ("head" for the head) -> its Ray container."""
    out = {"head": rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]}
    out |= {name: g["template"]["spec"]["containers"][0] for name, g in _groups(rs).items()}
    return out


def _plain_env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


@pytest.mark.parametrize("variant", ["default", "multi-gpu-values"])
def test_every_ray_pod_runs_with_the_env_gambit_serve_sets(rendered, variant):
    from gambit.deployments.local import SERVE_ENV

    assert SERVE_ENV["RAY_worker_niceness"] == "0" and SERVE_ENV["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == "1"
    containers = _ray_containers(_rayservice(rendered[variant]))
    assert set(containers) == {"head", "gpu-workers", "cpu-workers"}
    for c in containers.values():
        assert _plain_env(c) == SERVE_ENV
        names = [e["name"] for e in c["env"]]
        assert len(names) == len(set(names))


def test_extra_env_adds_and_overrides_the_serve_env(helm):
    from ops_util import render

    from gambit.deployments.local import SERVE_ENV

    docs = render(helm, "--set", "serve.extraEnv.RAY_worker_niceness=5", "--set-string",
                  "serve.extraEnv.OMP_NUM_THREADS=4")
    for c in _ray_containers(by_kind(docs, "RayService")[0]).values():
        assert _plain_env(c) == SERVE_ENV | {"RAY_worker_niceness": "5", "OMP_NUM_THREADS": "4"}
    r = run([helm, "template", "g", str(CHART), "--set", "serve.extraEnv.9LIVES=1"])
    assert r.returncode != 0 and "- serve.extraEnv:" in r.stderr


def test_bearer_token_from_a_secret(helm):
    from ops_util import render

    docs = render(helm, "--set", "serve.tokenSecret=gambit-token")
    (rs,) = by_kind(docs, "RayService")
    for c in [rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]] + [
            g["template"]["spec"]["containers"][0] for g in _groups(rs).values()]:
        ref = {"name": "gambit-token", "key": "token"}
        assert {"name": "GAMBIT_TOKEN", "valueFrom": {"secretKeyRef": ref}} in c["env"]


def test_external_redis_runs_no_redis(rendered):
    docs = rendered["external-redis-values"]
    assert by_kind(docs, "StatefulSet") == []
    (secret,) = by_kind(docs, "Secret")
    assert secret["stringData"] == {"redis-password": "change-me"}
    cfg = yaml.safe_load(_rayservice(docs)["spec"]["serveConfigV2"])
    assert cfg["applications"][0]["args"]["tree"] == "redis://redis.example.internal:6379/0"


def test_an_external_redis_url_may_name_an_acl_user(helm):
    """The schema forbade any ``@``, so an ACL user could not be given (its password: the Secret)."""
    from ops_util import render

    url = "redis://gambit@redis.example.internal:6379/0"
    docs = render(helm, "--set", "redis.mode=external", "--set", f"redis.external.url={url}",
                  "--set", "redis.external.password=change-me")
    cfg = yaml.safe_load(_rayservice(docs)["spec"]["serveConfigV2"])
    assert cfg["applications"][0]["args"]["tree"] == url


def test_external_redis_without_url_is_refused(helm):
    r = run([helm, "template", "g", str(CHART), "--set", "redis.mode=external"])
    assert r.returncode != 0 and "redis.external.url is required" in r.stderr


def test_monitoring_objects_and_dashboards(rendered):
    docs = rendered["default"]
    assert len(by_kind(docs, "PodMonitor")) == 1
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((REPO / "deploy/prometheus/gambit-rules.yaml").read_text())
    (cm,) = [c for c in by_kind(docs, "ConfigMap") if "dashboard" in c["metadata"]["name"]]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gambit-overview.json"]) == json.loads(dashboard_json())
    assert {p["metadata"]["name"] for p in by_kind(docs, "PodDisruptionBudget")} == {
        "gambit-gpu-worker", "gambit-cpu-worker"}
    off = rendered["no-monitoring-values"]
    assert not by_kind(off, "PodMonitor") and not by_kind(off, "PrometheusRule")
    assert not [c for c in by_kind(off, "ConfigMap") if "grafana_dashboard" in c["metadata"].get("labels", {})
                ]


@pytest.mark.parametrize("setting, field", [
    ("gpuWorkers.replicas=two", "gpuWorkers.replicas"),
    ("serve.deployments.Target.numReplica=2", "serve.deployments.Target"),
    ("redis.mode=sentinel", "redis.mode"),
    ("serve.grpcPort=70000", "serve.grpcPort"),
    ("monitoring.podMonitor.interval=soon", "monitoring.podMonitor.interval"),
    ("gpuWorkers.gpusPerWorker=0", "gpuWorkers.gpusPerWorker"),
    ("redis.external.url=redis://:secret@host:6379", "redis.external.url"),
    ("redis.external.url=redis://gambit:secret@host:6379", "redis.external.url"),
    ("serve.solveDefaults.capacity=0", "serve.solveDefaults.capacity"),
    ("upgradeStrategy=Rolling", "upgradeStrategy"),
    ("serve.kvDtype=float16", "serve.kvDtype"),
    ("serve.cpuWeights=int8", "serve.cpuWeights"),
    ("serve.batchWaitMs=40000", "serve.batchWaitMs"),  # each Score call waits it; a Target gives up at 2 s
    ("serve.maxKeys=0", "serve.maxKeys"),
    ("serve.specMaxBatch=-1", "serve.specMaxBatch"),
    ("serve.maxResumes=-1", "serve.maxResumes"),
    ("serve.resumeWaitS=0", "serve.resumeWaitS"),
    ("serve.targetThreads=-1", "serve.targetThreads"),
    ("serve.scorerAddress=scorer.example.internal", "serve.scorerAddress"),  # no port
    ("serve.scorerTls.secret=Scorer_TLS", "serve.scorerTls.secret"),  # no Secret name
    ("serve.scorerTls.caFile=ca.pem", "serve.scorerTls"),
    ("serve.maxStateMb=0", "serve.maxStateMb"),
    ("serve.maxRows=0", "serve.maxRows"),
    ("serve.maxNumSeqs=0", "serve.maxNumSeqs"),
])
def test_values_breaking_the_schema_are_refused_naming_the_field(helm, setting, field):
    r = run([helm, "template", "g", str(CHART), "--set", setting])
    assert r.returncode != 0
    assert "values don't meet the specifications of the schema" in r.stderr
    assert f"- {field}:" in r.stderr, r.stderr


@pytest.mark.parametrize("settings, message", [
    (("gpuWorkers.replicas=0",), "gpuWorkers.replicas: 0 is outside [minReplicas 1, maxReplicas 1]"),
    (("gpuWorkers.minReplicas=3", "gpuWorkers.maxReplicas=2", "gpuWorkers.replicas=2"),
     "gpuWorkers: minReplicas 3 is above maxReplicas 2"),
    (("cpuWorkers.replicas=5",), "cpuWorkers.replicas: 5 is outside [minReplicas 1, maxReplicas 2]"),
    (("gpuWorkers.replicas=0", "gpuWorkers.minReplicas=0"),
     "gpuWorkers.replicas: 0 GPU workers with autoscaling"),
])
def test_worker_counts_the_schema_cannot_compare_are_refused(helm, settings, message):
    r = run([helm, "template", "g", str(CHART), *[a for s in settings for a in ("--set", s)]])
    assert r.returncode != 0 and message in r.stderr, r.stderr
    # with Ray's autoscaler on, no GPU worker at start is a choice: it adds one for the Targets
    r = run([helm, "template", "g", str(CHART), "--set", "gpuWorkers.replicas=0",
             "--set", "gpuWorkers.minReplicas=0", "--set", "autoscaling.enabled=true"])
    assert r.returncode == 0, r.stderr


def _notes(helm, tmp_path, *args: str) -> str:
    # `helm install --dry-run` needs a cluster; render NOTES.txt through tpl in a copy of the chart instead.
    chart = tmp_path / "gambit"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "NOTES.txt")
        (chart / "templates" / "notes-as-manifest.yaml").write_text(
            'notes: |\n  {{- tpl (.Files.Get "files/NOTES.txt") . | nindent 2 }}\n')
    r = run([helm, "template", "g", str(chart), "--namespace", "serving", *args,
             "--show-only", "templates/notes-as-manifest.yaml"])
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)["notes"]


def test_notes_render(helm, tmp_path):
    notes = _notes(helm, tmp_path, "-f", str(CHART / "ci" / "multi-gpu-values.yaml"))
    assert "4 GPU worker(s) x 2 GPU, 4 to 12 Target replicas, autoscaled by Serve" in notes
    assert "on Service g-gambit-grpc" in notes
    assert "gambit cluster wait --name g-gambit --namespace serving" in notes
    assert "ConfigMap g-gambit-dashboard-gambit-overview" in notes
    # what to run once the port is forwarded
    want = 'gambit client solve --address 127.0.0.1:9000 --token-env GAMBIT_TOKEN "Compute (14+25)*3."'
    assert want in notes


def test_a_sequence_scorer_runs_one_replica(helm):
    """Its per-trace history lives in its replica: the chart's default autoscaling (up to four) would
    score a trace on two."""
    for scorer, autoscaled in (("sequence", False), ("random:sequence:192", False), ("mlp", True)):
        r = run([helm, "template", "g", str(CHART), "--set", f"serve.scorer={scorer}"])
        assert r.returncode == 0, r.stderr
        doc = next(d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "RayService")
        apps = yaml.safe_load(doc["spec"]["serveConfigV2"])["applications"]
        dep = next(a for a in apps if a["name"] == "scorer")["deployments"][0]
        assert ("autoscaling_config" in dep) is autoscaled, scorer
        assert autoscaled or dep["num_replicas"] == 1


def test_notes_say_the_service_is_plaintext_and_warn_when_it_is_exposed(helm, tmp_path):
    """A LoadBalancer with no token rendered silently: anyone who reached it could Solve, GetRun and
    CancelRun; the token, when set, crosses it in clear text."""
    notes = _notes(helm, tmp_path)
    assert "The Service speaks plaintext gRPC (Ray's proxy has no TLS)" in notes
    assert "TLS-terminating load balancer or ingress" in notes and "WARNING" not in notes
    notes = _notes(helm, tmp_path, "--set", "grpcService.type=LoadBalancer",
                   "--set", "grpcService.allowUnauthenticated=true")
    assert ("WARNING: grpcService.type is LoadBalancer: the ReasoningService is reachable from outside the "
            "cluster in plaintext with NO bearer token") in notes
    notes = _notes(helm, tmp_path, "--set", "grpcService.type=NodePort", "--set", "serve.tokenSecret=tok")
    assert "reachable from outside the cluster in plaintext, the bearer token included." in notes


def test_notes_warn_that_no_ray_auth_opens_the_dashboard(helm, tmp_path):
    """The chart binds the dashboard to 0.0.0.0; with Ray's auth off its Jobs API runs anyone's code."""
    assert "rayAuth.mode is disabled" not in _notes(helm, tmp_path)
    notes = _notes(helm, tmp_path, "--set", "rayAuth.mode=disabled")
    assert "WARNING: rayAuth.mode is disabled and the Ray dashboard listens on 0.0.0.0" in notes
    assert "submit Ray jobs, which run code in the cluster" in notes


def test_an_exposed_service_with_no_token_renders_only_when_asked(helm):
    from ops_util import render

    docs = render(helm, "--set", "grpcService.type=LoadBalancer",
                  "--set", "grpcService.allowUnauthenticated=true")
    assert _rayservice(docs)["spec"]["serveService"]["spec"]["type"] == "LoadBalancer"
    r = run([helm, "template", "g", str(CHART), "--set", "grpcService.type=LoadBalancer"])
    assert r.returncode != 0 and "serve.tokenSecret" in r.stderr and "allowUnauthenticated" in r.stderr


def test_redis_probe_keeps_the_password_off_the_command_line(rendered):
    """`redis-cli -a "$REDIS_PASSWORD"` every 5 s put it in /proc/<pid>/cmdline, which a node's `ps` shows."""
    (sts,) = by_kind(rendered["default"], "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    cmd = c["readinessProbe"]["exec"]["command"]
    assert cmd[:2] == ["sh", "-c"] and cmd[2].startswith('REDISCLI_AUTH="$REDIS_PASSWORD" redis-cli ping')
    assert " -a " not in cmd[2] and "$REDIS_PASSWORD" not in cmd[2].partition("redis-cli")[2]


def test_an_outside_tls_scorer_and_other_unreachable_args_equal_the_kubernetes_profile(helm):
    """A TLS Scorer (the Target's ``scorer_tls_*``), the Scorer's ``max_keys``, the Target's
    ``spec_max_batch`` and ``threads`` and the Coordinator's ``max_resumes``/``resume_wait_s`` had no chart
    value: set now, their serveConfigV2 is what ``serve_config`` makes of
    the same ServeAppSpec, and the Secret holding the CA (and client pair) is mounted where the paths say
    on both worker groups (a Target with numGpus 0 may land on the CPU group)."""
    from ops_util import render

    from gambit.ops.serve_config import SCORER_TLS_DIR, ServeAppSpec, profile, serve_config

    docs = render(helm, "--set", "serve.scorerAddress=scorer.example.internal:50061",
                  "--set", "serve.scorerTls.secret=scorer-tls", "--set", "serve.scorerTls.clientCert=true",
                  "--set", "serve.scorerTls.serverName=scorer", "--set", "serve.maxKeys=1000",
                  "--set", "serve.specMaxBatch=16", "--set", "serve.maxResumes=5",
                  "--set", "serve.resumeWaitS=10", "--set", "serve.targetThreads=8")
    rs = _rayservice(docs)
    cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    files = (("scorer_tls_ca", "ca.crt"), ("scorer_tls_cert", "tls.crt"), ("scorer_tls_key", "tls.key"))
    tls = {k: f"{SCORER_TLS_DIR}/{f}" for k, f in files}
    spec = ServeAppSpec(scorer_address="scorer.example.internal:50061", scorer_tls_server_name="scorer",
                        max_keys=1000, spec_max_batch=16, max_resumes=5, resume_wait_s=10.0,
                        target_threads=8, **tls)
    want = serve_config(profile("kubernetes", spec))
    want["applications"][0]["args"]["tree"] = cfg["applications"][0]["args"]["tree"]
    assert cfg == want
    for name, group in _groups(rs).items():
        pod = group["template"]["spec"]
        assert pod["volumes"] == [{"name": "scorer-tls", "secret": {"secretName": "scorer-tls"}}], name
        mount = {"name": "scorer-tls", "mountPath": SCORER_TLS_DIR, "readOnly": True}
        assert pod["containers"][0]["volumeMounts"] == [mount], name
    for name, group in _groups(_rayservice(render(helm))).items():  # no Secret: nothing mounted
        assert "volumes" not in group["template"]["spec"], name
    ca_only = yaml.safe_load(_rayservice(render(
        helm, "--set", "serve.scorerAddress=10.0.0.5:50061", "--set", "serve.scorerTls.secret=s"))[
        "spec"]["serveConfigV2"])["applications"][0]["args"]["target"]
    assert (ca_only["scorer_tls_ca"], ca_only["scorer_tls_cert"], ca_only["scorer_tls_key"]) == (
        f"{SCORER_TLS_DIR}/ca.crt", "", "")


@pytest.mark.parametrize("settings, message", [
    (("serve.scorerTls.secret=s",), "serve.scorerTls.secret: set only with serve.scorerAddress"),
    (("serve.scorerAddress=h:1", "serve.scorerTls.clientCert=true"), "serve.scorerTls.secret: needed with"),
    (("serve.scorerAddress=h:1", "serve.scorerTls.serverName=h"), "serve.scorerTls.secret: needed with"),
])
def test_scorer_tls_values_that_cannot_work_are_refused(helm, settings, message):
    r = run([helm, "template", "g", str(CHART), *[a for s in settings for a in ("--set", s)]])
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_scorer_state_bytes_rows_and_the_engine_batch_equal_the_kubernetes_profile(helm):
    """The Scorer's ``max_state_mb`` and ``max_rows`` and the Target's ``max_num_seqs`` (a Gambit
    request's capacity at most) had no chart value."""
    from ops_util import render

    from gambit.ops.serve_config import ServeAppSpec, profile, serve_config

    docs = render(helm, "--set", "serve.maxStateMb=64", "--set", "serve.maxRows=512",
                  "--set", "serve.maxNumSeqs=32")
    cfg = yaml.safe_load(_rayservice(docs)["spec"]["serveConfigV2"])
    want = serve_config(profile("kubernetes", ServeAppSpec(max_state_mb=64, max_rows=512, max_num_seqs=32)))
    want["applications"][0]["args"]["tree"] = cfg["applications"][0]["args"]["tree"]
    assert cfg == want
    assert cfg["applications"][0]["args"]["target"]["max_num_seqs"] == 32


def test_an_outside_scorer_deploys_no_scorer_app(helm):
    """With serve.scorerAddress the scorer app was still deployed (and counted against the CPU group),
    though no Target calls it."""
    from ops_util import render

    from gambit.ops.serve_config import ServeAppSpec, profile, serve_config

    docs = render(helm, "--set", "serve.scorerAddress=scorer.example.internal:50061")
    cfg = yaml.safe_load(_rayservice(docs)["spec"]["serveConfigV2"])
    assert [a["name"] for a in cfg["applications"]] == ["gambit"]
    want = serve_config(profile("kubernetes", ServeAppSpec(scorer_address="scorer.example.internal:50061")))
    want["applications"][0]["args"]["tree"] = cfg["applications"][0]["args"]["tree"]
    assert cfg == want
    # a CPU group too small for the Coordinator and the Scorer holds the Coordinator alone
    small = ("--set", "cpuWorkers.resources.limits.cpu=4")
    assert "the Coordinator and Scorer need up to 5 CPUs" in run(
        [helm, "template", "g", str(CHART), *small]).stderr
    render(helm, *small, "--set", "serve.scorerAddress=h:1")
    r = run([helm, "template", "g", str(CHART), *small, "--set", "serve.scorerAddress=h:1",
             "--set", "serve.deployments.Coordinator.numCpus=5"])
    assert "cpuWorkers: the Coordinator needs up to 5 CPUs" in r.stderr, r.stderr
    # an outside Scorer's own rows limit is not known: serve.maxRows is not compared then
    render(helm, "--set", "serve.scorerAddress=h:1", "--set", "serve.maxRows=16")


@pytest.mark.parametrize("settings, message", [
    (("serve.maxNumSeqs=4",), "serve.maxNumSeqs: 4 is below serve.solveDefaults.capacity 8: every Gambit"),
    (("serve.maxRows=100",), "serve.maxRows: 100 is below serve.maxNumSeqs 256: a step's boundaries"),
])
def test_an_engine_batch_its_runs_or_scorer_cannot_fill_is_refused(helm, settings, message):
    r = run([helm, "template", "g", str(CHART), *[a for s in settings for a in ("--set", s)]])
    assert r.returncode != 0 and message in r.stderr, r.stderr
