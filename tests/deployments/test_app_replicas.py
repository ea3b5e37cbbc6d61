"""What Ray Serve itself makes of the builders (``gambit.deployments.app``) under the generated config
(``gambit.ops.serve_config``): the replica counts each deployment ends up with, through Serve's own
config override (the step ``serve deploy`` and KubeRay go through), with no cluster started."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.application_state import override_deployment_info  # noqa: E402
from ray.serve._private.build_app import build_app  # noqa: E402
from ray.serve._private.config import ReplicaConfig  # noqa: E402
from ray.serve._private.deployment_info import DeploymentInfo  # noqa: E402
from ray.serve.schema import ServeApplicationSchema  # noqa: E402

from gambit.deployments.app import build_gambit, build_scorer  # noqa: E402
from gambit.ops.serve_config import ServeAppSpec, profile, serve_config  # noqa: E402

BUILDERS = {"gambit": build_gambit, "scorer": build_scorer}


def _deployed(cfg: dict, app: str) -> dict[str, tuple]:
    """Deployment name -> (replicas, autoscaling (min, max) or None, init kwargs) as Serve deploys it."""
    (spec,) = [a for a in cfg["applications"] if a["name"] == app]
    built = build_app(BUILDERS[app](spec["args"]), name=app)
    # the replica config without the init args: Serve's deepcopy of a DeploymentHandle starts Ray
    infos = {d.name: DeploymentInfo(deployment_config=d._deployment_config, start_time_ms=0,
                                    replica_config=ReplicaConfig.create(d.func_or_class,
                                                                        ray_actor_options=d.ray_actor_options),
                                    deployer_job_id="test")
             for d in built.deployments}
    kwargs = {d.name: d.init_kwargs for d in built.deployments}
    schema = ServeApplicationSchema.model_validate({k: v for k, v in spec.items() if k != "route_prefix"})
    out = {}
    for name, info in override_deployment_info(infos, schema).items():
        c = info.deployment_config
        auto = c.autoscaling_config
        # Serve autoscales whenever autoscaling_config is set (num_replicas is then ignored)
        out[name] = (None if auto else c.num_replicas,
                     (auto.min_replicas, auto.max_replicas) if auto else None, kwargs[name])
    import ray

    assert not ray.is_initialized()  # no cluster was needed (nor started) for any of this
    return out


def _with(spec: ServeAppSpec, name: str, **changes) -> ServeAppSpec:
    return replace(spec, deployments=tuple(replace(d, **changes) if d.name == name else d
                                           for d in spec.deployments))


def test_the_default_configs_deploy_as_generated():
    for name in ("local", "kubernetes"):
        cfg = serve_config(profile(name))
        scorer = _deployed(cfg, "scorer")["Scorer"]
        assert scorer[:2] == (None, (1, 4)), name
        gambit = _deployed(cfg, "gambit")
        assert gambit["Target"][:2] == (1, None) and gambit["Coordinator"][:2] == (1, None), name
        assert gambit["Coordinator"][2]["target_replicas"] == 1


def test_an_explicit_scorer_count_is_what_serve_runs():
    """The Scorer's code autoscales (1 to 2): under a config's bare ``num_replicas`` Serve keeps that and
    ignores the count, so the config also says ``autoscaling_config: null``."""
    cfg = serve_config(profile("kubernetes", _with(ServeAppSpec(), "Scorer", num_replicas=3)))
    assert _deployed(cfg, "scorer")["Scorer"][:2] == (3, None)
    (app,) = [a for a in cfg["applications"] if a["name"] == "scorer"]
    del app["deployments"][0]["autoscaling_config"]  # the count alone: Serve still autoscales it
    assert _deployed(cfg, "scorer")["Scorer"][:2] == (None, (1, 2))


def test_an_autoscaled_target_is_autoscaled_and_the_coordinator_knows_its_most():
    """build_gambit gives the Target ``num_replicas=target_replicas`` in code; the config's
    autoscaling_config replaces it (Serve ignores the code's count, no refusal), and the Coordinator is
    told the most Targets there can be."""
    auto = (("min_replicas", 2), ("max_replicas", 8))
    cfg = serve_config(profile("kubernetes", _with(ServeAppSpec(), "Target", autoscaling=auto)))
    gambit = _deployed(cfg, "gambit")
    assert gambit["Target"][:2] == (None, (2, 8))
    assert gambit["Coordinator"][2]["target_replicas"] == 8
