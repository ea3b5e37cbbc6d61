"""Serve's health check and stop settings of each deployment (``serve_config.TIMINGS``): they reach every
artefact (deploy/serve*.yaml, the chart's serveConfigV2, the builders `gambit serve` runs), bad ones are
refused naming the field, and they fit the code's own timeouts. No cluster started."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace

import pytest
import yaml
from ops_util import CHART, by_kind, run

from gambit.ops.generate import REPO
from gambit.ops.serve_config import (
    TARGET_CLOSE_S,
    TIMING_FIELDS,
    TIMINGS,
    DeploymentSpec,
    ServeAppSpec,
    profile,
    serve_config,
)

NAMES = ("Coordinator", "Target", "Scorer")


def _deployments(cfg: dict) -> dict[str, dict]:
    return {d["name"]: d for a in cfg["applications"] for d in a["deployments"]}


def _timings(d: dict) -> dict:
    return {k: d.get(k) for k in TIMING_FIELDS}


@pytest.mark.parametrize("name, path", [("local", "deploy/serve.yaml"),
                                        ("kubernetes", "deploy/serve-kubernetes.yaml")])
def test_timings_reach_the_generated_configs_and_serve_keeps_them(name, path):
    """Left out, Serve's defaults held: a Target got 20 s to stop, less than its close() may take."""
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve._private.build_app import build_app
    from ray.serve._private.config import ReplicaConfig
    from ray.serve._private.deployment_info import DeploymentInfo
    from ray.serve.schema import ServeApplicationSchema

    from gambit.deployments.app import build_gambit, build_scorer

    cfg = serve_config(profile(name))
    assert yaml.safe_load((REPO / path).read_text()) == cfg
    assert {n: _timings(d) for n, d in _deployments(cfg).items()} == TIMINGS
    builders = {"gambit": build_gambit, "scorer": build_scorer}
    for app in cfg["applications"]:  # what Serve deploys under the config (`serve deploy`, KubeRay)
        args = app["args"] | ({"target_gpus": 0} if app["name"] == "gambit" else {})
        built = build_app(builders[app["name"]](args), name=app["name"])
        for d in built.deployments:  # `gambit serve`: the builders alone, no config
            assert {k: getattr(d._deployment_config, k) for k in TIMING_FIELDS} == TIMINGS[d.name]
        infos = {d.name: DeploymentInfo(deployment_config=d._deployment_config, start_time_ms=0,
                                        replica_config=ReplicaConfig.create(d.func_or_class),
                                        deployer_job_id="test") for d in built.deployments}
        schema = ServeApplicationSchema.model_validate({k: v for k, v in app.items() if k != "route_prefix"})
        for dname, info in override_deployment_info(infos, schema).items():
            got = {k: getattr(info.deployment_config, k) for k in TIMING_FIELDS}
            assert got == TIMINGS[dname], dname


def test_the_chart_renders_the_timings_and_takes_its_values(helm, rendered):
    for variant, docs in rendered.items():
        (rs,) = by_kind(docs, "RayService")
        deps = _deployments(yaml.safe_load(rs["spec"]["serveConfigV2"]))
        assert {n: _timings(d) for n, d in deps.items()} == TIMINGS, variant
    r = run([helm, "template", "g", str(CHART),
             "--set", "serve.deployments.Target.gracefulShutdownTimeoutS=90",
             "--set-json", "serve.deployments.Scorer.healthCheckPeriodS=2.5"])
    assert r.returncode == 0, r.stderr
    (rs,) = by_kind(list(yaml.safe_load_all(r.stdout)), "RayService")
    deps = _deployments(yaml.safe_load(rs["spec"]["serveConfigV2"]))
    assert deps["Target"]["graceful_shutdown_timeout_s"] == 90
    assert deps["Scorer"]["health_check_period_s"] == 2.5
    assert _timings(deps["Coordinator"]) == TIMINGS["Coordinator"]


@pytest.mark.parametrize("fields, message", [
    ({"health_check_period_s": 0}, "Target: health_check_period_s must be > 0, got 0"),
    ({"health_check_timeout_s": -1.0}, "Target: health_check_timeout_s must be > 0"),
    ({"graceful_shutdown_timeout_s": -5}, "Target: graceful_shutdown_timeout_s must be >= 0"),
    ({"graceful_shutdown_wait_loop_s": math.nan}, "Target: graceful_shutdown_wait_loop_s must be a finite"),
    ({"health_check_period_s": math.inf}, "Target: health_check_period_s must be a finite"),
    ({"health_check_timeout_s": "30"}, "Target: health_check_timeout_s must be a number of seconds"),
    ({"graceful_shutdown_timeout_s": True}, "Target: graceful_shutdown_timeout_s must be a number"),
    ({"graceful_shutdown_wait_loop_s": 30.0, "graceful_shutdown_timeout_s": 20.0},
     "graceful_shutdown_wait_loop_s 30.0 is above graceful_shutdown_timeout_s 20.0"),
])
def test_bad_timings_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        DeploymentSpec.of("Target", **fields)
    spec = ServeAppSpec()
    with pytest.raises(ValueError, match=message):  # as a ServeAppSpec's deployment too
        replace(spec, deployments=tuple(replace(d, **fields) if d.name == "Target" else d
                                        for d in spec.deployments))


@pytest.mark.parametrize("setting, field", [
    ("serve.deployments.Target.healthCheckPeriodS=0", "serve.deployments.Target.healthCheckPeriodS"),
    ("serve.deployments.Scorer.healthCheckTimeoutS=-1", "serve.deployments.Scorer.healthCheckTimeoutS"),
    ("serve.deployments.Coordinator.gracefulShutdownTimeoutS=-1",
     "serve.deployments.Coordinator.gracefulShutdownTimeoutS"),
    ("serve.deployments.Target.gracefulShutdownWaitLoopS=soon",
     "serve.deployments.Target.gracefulShutdownWaitLoopS"),
])
def test_the_chart_refuses_bad_timings_naming_the_field(helm, setting, field):
    r = run([helm, "template", "g", str(CHART), "--set", setting])
    assert r.returncode != 0
    assert f"- {field}:" in r.stderr, r.stderr


def test_the_chart_refuses_a_stop_poll_longer_than_the_stop(helm):
    r = run([helm, "template", "g", str(CHART), "--set",
             "serve.deployments.Target.gracefulShutdownWaitLoopS=90"])
    assert r.returncode != 0
    want = "serve.deployments.Target.gracefulShutdownWaitLoopS: 90 is above gracefulShutdownTimeoutS 60"
    assert want in r.stderr, r.stderr


def test_the_timings_fit_the_codes_own_timeouts():
    """The Target's stop covers its close(); its check runs often enough for a wedged engine to be replaced
    soon after its lease lapsed; a Coordinator waits as long as the Targets whose runs it relays."""
    from ray.serve._private.constants import REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD as FAILS

    from gambit.serving.record_writer import RecordWriter
    from gambit.serving.run_lease import LEASE_S, STUCK_S
    from gambit.serving.scorer_client import RemoteScorer
    from gambit.serving.target_service import CLOSE_WAIT_S

    flush_s = inspect.signature(RecordWriter.flush).parameters["timeout"].default
    # close(): the wedged step's CLOSE_WAIT_S, the writer's flush, its join (5 s) and the scorer's (5 s)
    assert TARGET_CLOSE_S >= CLOSE_WAIT_S + flush_s + 5 + 5
    t = TIMINGS["Target"]
    assert t["graceful_shutdown_timeout_s"] >= t["graceful_shutdown_wait_loop_s"] + TARGET_CLOSE_S
    # a wedged engine (stuck past STUCK_S) fails FAILS checks in a row within a quarter of STUCK_S more, and
    # a check's timeout (a blocked event loop) is no shorter than a busy node's pause the lease allows
    assert FAILS * t["health_check_period_s"] <= STUCK_S / 4
    assert LEASE_S <= t["health_check_timeout_s"] < STUCK_S
    c, s = TIMINGS["Coordinator"], TIMINGS["Scorer"]
    assert c["graceful_shutdown_timeout_s"] >= t["graceful_shutdown_timeout_s"]
    scorer_deadline = inspect.signature(RemoteScorer.__init__).parameters["timeout_s"].default
    assert s["graceful_shutdown_timeout_s"] >= s["graceful_shutdown_wait_loop_s"] + scorer_deadline
    assert all(n in TIMINGS for n in NAMES)
