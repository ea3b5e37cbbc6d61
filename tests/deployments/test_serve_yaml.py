"""deploy/serve.yaml passes Ray's own schema and names importable builders and servicers."""

from pathlib import Path

import pytest
import yaml

from gambit.serving.grpc_api import SERVICER_FUNCTIONS

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "serve.yaml"


def test_serve_yaml_is_valid_for_ray_serve():
    schema = pytest.importorskip("ray.serve.schema")
    raw = yaml.safe_load(CONFIG.read_text())
    cfg = schema.ServeDeploySchema.model_validate(raw) if hasattr(schema.ServeDeploySchema,
                                                                  "model_validate") \
        else schema.ServeDeploySchema.parse_obj(raw)
    apps = {a.name: a for a in cfg.applications}
    assert set(apps) == {"gambit", "scorer"}
    assert cfg.grpc_options.grpc_servicer_functions == SERVICER_FUNCTIONS
    assert cfg.http_options.host == "127.0.0.1"
    import importlib

    for app in apps.values():
        module, attr = app.import_path.split(":")
        assert callable(getattr(importlib.import_module(module), attr))
    for path in SERVICER_FUNCTIONS:
        module, attr = path.rsplit(".", 1)
        assert callable(getattr(importlib.import_module(module), attr))
    scorer = next(d for d in apps["scorer"].deployments if d.name == "Scorer")
    assert scorer.autoscaling_config["min_replicas"] >= 1
    # the block replaces the code's, policy included: without it Serve's default never sees direct calls
    from gambit.deployments.scorer_autoscaling import POLICY

    assert scorer.autoscaling_config["policy"] == {"policy_function": POLICY}


def test_builders_make_applications_from_the_yaml_args():
    pytest.importorskip("ray.serve")
    from ray.serve import Application

    from gambit.deployments.app import build_gambit, build_scorer

    raw = yaml.safe_load(CONFIG.read_text())
    args = {a["name"]: a["args"] for a in raw["applications"]}
    assert isinstance(build_gambit(args["gambit"]), Application)
    assert isinstance(build_scorer(args["scorer"]), Application)


def test_local_launcher_batch_cap_is_the_engines():
    """``gambit serve`` keeps its own copy of the default (it does not import torch): the same value."""
    from gambit.deployments.local import ServeConfig
    from gambit.engine.config import SpecConfig

    assert ServeConfig().spec_max_batch == SpecConfig().max_batch


def test_bfloat16_weights_reach_each_target_and_bad_values_are_refused():
    """``gambit serve --cpu-weights bfloat16``: the Target's engine config carries it (serve.yaml: the
    ``cpu_weights`` key under ``target``); anything else is refused by name where it is configured."""
    from gambit.deployments.local import ServeConfig
    from gambit.serving.embedded import EmbeddedConfig

    assert ServeConfig(cpu_weights="bfloat16").app_args()["target"]["cpu_weights"] == "bfloat16"
    assert ServeConfig().app_args()["target"]["cpu_weights"] == "float32"
    for cls in (ServeConfig, EmbeddedConfig):
        with pytest.raises(ValueError, match="cpu_weights must be float32 or bfloat16, got 'fp16'"):
            cls(cpu_weights="fp16")


def test_a_bfloat16_kv_cache_reaches_each_target_and_bad_values_are_refused():
    """``gambit serve --kv-dtype bfloat16``: the Target's engine config carries it (``kv_dtype`` under
    ``target``); anything else is refused by name where it is configured."""
    from gambit.deployments.local import ServeConfig
    from gambit.serving.embedded import EmbeddedConfig

    assert ServeConfig(kv_dtype="bfloat16").app_args()["target"]["kv_dtype"] == "bfloat16"
    assert ServeConfig().app_args()["target"]["kv_dtype"] == "auto"
    for cls in (ServeConfig, EmbeddedConfig):
        with pytest.raises(ValueError, match="kv_dtype must be auto, float32 or bfloat16, got 'fp8'"):
            cls(kv_dtype="fp8")


def test_batch_invariance_reaches_each_target():
    """``gambit serve --batch-invariant``: the Target's engine config carries it (``batch_invariant``)."""
    from gambit.deployments.local import ServeConfig

    assert ServeConfig(batch_invariant=True).app_args()["target"]["batch_invariant"] is True
    assert ServeConfig(batch_invariant=False).app_args()["target"]["batch_invariant"] is False
    assert ServeConfig().app_args()["target"]["batch_invariant"] is None  # on where it holds
