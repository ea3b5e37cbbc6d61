"""The Serve config from ``gambit.ops.serve_config``: replica counts as the chart reads them (an explicit
count wins over an autoscaling block), what the Coordinator is told of the Targets, and ports Ray uses."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from gambit.ops.serve_config import ServeAppSpec, profile, serve_config


def _with(spec: ServeAppSpec, name: str, **changes) -> ServeAppSpec:
    return replace(spec, deployments=tuple(replace(d, **changes) if d.name == name else d
                                           for d in spec.deployments))


def _deployments(cfg: dict) -> dict[str, dict]:
    return {d["name"]: d for a in cfg["applications"] for d in a["deployments"]}


def _schema_ok(cfg: dict) -> None:
    from ray.serve.schema import ServeDeploySchema

    ServeDeploySchema.model_validate(cfg)


@pytest.mark.parametrize("name", ["local", "kubernetes"])
def test_an_explicit_scorer_count_wins_over_its_default_autoscaling(name):
    """The Scorer autoscales by default (SCORER_AUTOSCALING); num_replicas 2 set on it was refused ("set
    num_replicas or autoscaling, not both") for a default nobody set. The chart's rule: the count wins.
    ``autoscaling_config: null`` comes with it, since the Scorer's code autoscales too (see
    tests/deployments/test_app_replicas.py for what Serve makes of it)."""
    cfg = serve_config(profile(name, _with(ServeAppSpec(), "Scorer", num_replicas=2)))
    scorer = _deployments(cfg)["Scorer"]
    assert scorer["num_replicas"] == 2 and scorer["autoscaling_config"] is None
    _schema_ok(cfg)
    default = _deployments(serve_config(profile(name)))["Scorer"]  # unchanged: autoscaled, no count
    assert "num_replicas" not in default and default["autoscaling_config"]["max_replicas"] == 4


def test_an_autoscaled_target_tells_the_coordinator_its_max_replicas():
    """``target_replicas`` bounds the replicas a run refused for its KV is tried on (coordinator.py,
    Call.try_elsewhere): it was ``num_replicas or 1``, so with Targets autoscaled up to 8 a run one
    replica refused was never tried on another. The chart passes max_replicas too."""
    auto = (("min_replicas", 2), ("max_replicas", 8), ("target_ongoing_requests", 32))
    for name in ("local", "kubernetes"):  # kubernetes pinned the Target at 1, refusing the autoscaling
        spec = profile(name, _with(_with(ServeAppSpec(), "Target", autoscaling=auto), "Coordinator",
                                   autoscaling=(("min_replicas", 1), ("max_replicas", 3))))
        cfg = serve_config(spec)
        args = cfg["applications"][0]["args"]
        assert (args["target_replicas"], args["coordinator_replicas"]) == (8, 3), name
        target = _deployments(cfg)["Target"]
        assert "num_replicas" not in target and target["autoscaling_config"]["max_replicas"] == 8
        _schema_ok(cfg)
    pinned = serve_config(_with(ServeAppSpec(), "Target", num_replicas=3, autoscaling=auto))
    assert pinned["applications"][0]["args"]["target_replicas"] == 3  # the count wins here too
    assert "autoscaling_config" not in _deployments(pinned)["Target"]


def test_a_kubernetes_target_keeps_an_explicit_count():
    """The kubernetes profile set every Target count to 1; the default is still 1."""
    assert _deployments(serve_config(profile("kubernetes")))["Target"]["num_replicas"] == 1
    spec = profile("kubernetes", _with(ServeAppSpec(), "Target", num_replicas=3))
    cfg = serve_config(spec)
    assert _deployments(cfg)["Target"]["num_replicas"] == 3
    assert cfg["applications"][0]["args"]["target_replicas"] == 3


@pytest.mark.parametrize("ports, message", [
    ({"grpc_port": 6379}, "grpc_port: 6379 is Ray's GCS port"),
    ({"grpc_port": 8265}, "grpc_port: 8265 is Ray's dashboard port"),
    ({"http_port": 10001}, "http_port: 10001 is Ray's client server port"),
    ({"http_port": 52365}, "http_port: 52365 is Ray's dashboard agent port"),
    ({"grpc_port": 8000}, "http_port and grpc_port are both 8000"),
    ({"grpc_port": 0}, "grpc_port must be a TCP port (1-65535), got 0"),
])
def test_ports_ray_uses_are_refused_by_name(ports, message):
    """A proxy on a port Ray (or Redis, at 6379 here) listens on started and then failed obscurely."""
    from gambit.deployments.local import ServeConfig

    with pytest.raises(ValueError, match="^" + re.escape(message)) as e:
        ServeAppSpec(**ports)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServeConfig(**ports)
    with pytest.raises(ValueError, match="^metrics_port: 8265 is Ray's dashboard port"):
        ServeConfig(metrics_port=8265)
    with pytest.raises(ValueError, match="^metrics_port and http_port are both 8000"):
        ServeConfig(metrics_port=8000)
