"""The Scorer's autoscaling policy on every config surface. A config's ``autoscaling_config`` replaces the
code's whole block, policy included: serve_config's profiles, deploy/serve*.yaml and the chart deployed
Serve's default policy, which never sees the direct endpoint's calls (a busy Scorer stayed at one)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from ops_util import CHART, REPO, render, run

from gambit.deployments.scorer_autoscaling import POLICY
from gambit.ops.serve_config import DeploymentSpec, ServeAppSpec, profile, serve_config

POLICY_BLOCK = {"policy_function": POLICY}


def _scorer(cfg: dict) -> dict:
    (app,) = [a for a in cfg["applications"] if a["name"] == "scorer"]
    (dep,) = app["deployments"]
    return dep


def _served_policy(cfg: dict) -> str | None:
    """The Scorer's policy_function as Serve deploys it: Ray's schema, then Serve's own override of the
    code's deployment config (the step `serve deploy` and KubeRay go through), with no cluster."""
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve._private.build_app import build_app
    from ray.serve._private.config import ReplicaConfig
    from ray.serve._private.deployment_info import DeploymentInfo
    from ray.serve.schema import ServeDeploySchema

    from gambit.deployments.app import build_scorer

    (app,) = [a for a in ServeDeploySchema.model_validate(cfg).applications if a.name == "scorer"]
    (d,) = build_app(build_scorer(app.args), name="scorer").deployments
    infos = {d.name: DeploymentInfo(deployment_config=d._deployment_config, start_time_ms=0,
                                    replica_config=ReplicaConfig.create(d.func_or_class,
                                                                        ray_actor_options=d.ray_actor_options),
                                    deployer_job_id="test")}
    auto = override_deployment_info(infos, app)["Scorer"].deployment_config.autoscaling_config
    return auto.policy.policy_function if auto else None


@pytest.mark.parametrize("name", ["local", "kubernetes"])
def test_every_profile_and_generated_file_deploys_the_scorers_policy(name):
    cfg = serve_config(profile(name))
    assert _scorer(cfg)["autoscaling_config"]["policy"] == POLICY_BLOCK
    assert _served_policy(cfg) == POLICY  # Serve's default policy on the old config
    path = REPO / "deploy" / ("serve.yaml" if name == "local" else "serve-kubernetes.yaml")
    generated = yaml.safe_load(path.read_text())
    assert _scorer(generated)["autoscaling_config"]["policy"] == POLICY_BLOCK
    assert _served_policy(generated) == POLICY


def test_a_pinned_scorer_has_no_policy_and_a_malformed_one_is_refused():
    scorer = next(d for d in ServeAppSpec().deployments if d.name == "Scorer")
    pinned = serve_config(replace(ServeAppSpec(), deployments=tuple(
        replace(d, num_replicas=2) if d.name == "Scorer" else d for d in ServeAppSpec().deployments)))
    assert _scorer(pinned)["autoscaling_config"] is None  # the count wins, policy and all
    assert "autoscaling_config" not in _scorer(serve_config(ServeAppSpec(scorer="sequence")))
    assert replace(scorer, autoscaling=()).to_dict().get("autoscaling_config") is None
    for bad in ("scorer_autoscaling_policy", "gambit.deployments.scorer_autoscaling.policy", "a:b c", ":f"):
        with pytest.raises(ValueError, match="Scorer: autoscaling_policy must be module.path:function"):
            DeploymentSpec("Scorer", autoscaling=(("max_replicas", 2),), autoscaling_policy=bad)


def _chart_scorer(helm, *args: str) -> tuple[dict, dict]:
    (rs,) = [d for d in render(helm, *args) if d["kind"] == "RayService"]
    cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    return cfg, _scorer(cfg)


def test_the_charts_scorer_keeps_the_policy_under_overrides(helm):
    cfg, scorer = _chart_scorer(helm)
    assert scorer["autoscaling_config"]["policy"] == POLICY_BLOCK and _served_policy(cfg) == POLICY
    # a user's block merges into the default (Helm merges maps): the policy stays, as the comment says
    _, scorer = _chart_scorer(helm, "--set-json",
                              'serve.deployments.Scorer.autoscaling={"min_replicas":2,"max_replicas":3}')
    assert scorer["autoscaling_config"]["policy"] == POLICY_BLOCK
    auto = scorer["autoscaling_config"]
    assert (auto["min_replicas"], auto["max_replicas"]) == (2, 3)
    # dropped on purpose: Serve's default policy, still a valid config
    cfg, scorer = _chart_scorer(helm, "--set", "serve.deployments.Scorer.autoscaling.policy=null")
    assert "policy" not in scorer["autoscaling_config"] and _served_policy(cfg) != POLICY


def test_the_chart_schema_refuses_a_malformed_policy(helm):
    for bad in ('{"policy_function":"no_colon"}', '{"policy_fn":"a.b:c"}'):
        r = run([helm, "template", "gambit", str(CHART), "--namespace", "serving", "--set-json",
                 f"serve.deployments.Scorer.autoscaling.policy={bad}"])
        assert r.returncode != 0 and "serve.deployments.Scorer.autoscaling.policy" in r.stderr, r.stderr
