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


def _args(cfg: dict) -> tuple[dict, dict]:
    """The Target's kwargs and the Scorer's ({} without a scorer app), from a serve config."""
    gambit, *scorer = cfg["applications"]
    return gambit["args"]["target"], scorer[0]["args"] if scorer else {}


def test_scorer_max_keys_and_gambit_constant_match_the_scorer():
    """``max_keys`` (trace histories a sequence scorer keeps) was a Scorer argument no config could set."""
    import inspect

    from gambit.deployments.scorer import Scorer
    from gambit.ops.serve_config import MAX_KEYS
    from gambit.scoring.scorer import MAX_KEYS as SCORING_MAX_KEYS

    assert MAX_KEYS == SCORING_MAX_KEYS
    for name in ("local", "kubernetes"):
        _, scorer = _args(serve_config(profile(name, ServeAppSpec(max_keys=1000))))
        assert scorer["max_keys"] == 1000
        assert set(scorer) <= set(inspect.signature(Scorer.func_or_class.__init__).parameters)
    assert _args(serve_config(ServeAppSpec()))[1]["max_keys"] == MAX_KEYS


def test_an_outside_tls_scorer_reaches_the_targets():
    """The Target's ``scorer_tls_*`` (a TLS ScorerService, ``gambit scorer serve --tls-cert``) were
    unreachable from ServeAppSpec and the chart. An outside Scorer is called as itself: no ``scorer_app``,
    or the Target looked up the Ray Scorer's direct endpoint and called that instead."""
    import inspect

    from gambit.deployments.target import Target

    spec = ServeAppSpec(scorer_address="scorer.example.internal:50061", scorer_tls_ca="/tls/ca.crt",
                        scorer_tls_cert="/tls/tls.crt", scorer_tls_key="/tls/tls.key",
                        scorer_tls_server_name="scorer", spec_max_batch=16)
    cfg = serve_config(profile("kubernetes", spec))
    _schema_ok(cfg)
    target, _ = _args(cfg)
    assert {k: v for k, v in target.items() if k.startswith("scorer_") or k == "spec_max_batch"} == {
        "scorer_address": "scorer.example.internal:50061", "scorer_app": "", "scorer_tls_ca": "/tls/ca.crt",
        "scorer_tls_cert": "/tls/tls.crt", "scorer_tls_key": "/tls/tls.key",
        "scorer_tls_server_name": "scorer", "spec_max_batch": 16}
    assert set(target) <= set(inspect.signature(Target.func_or_class.__init__).parameters)
    plain, _ = _args(serve_config(ServeAppSpec()))  # the default: the scorer app through the proxy
    assert (plain["scorer_address"], plain["scorer_app"], plain["scorer_tls_ca"]) == ("127.0.0.1:9000",
                                                                                       "scorer", "")
    assert "spec_max_batch" not in plain  # the engine's default, which depends on the Target's CPU


@pytest.mark.parametrize("fields, message", [
    ({"max_keys": 0}, "max_keys must be >= 1, got 0"),
    ({"spec_max_batch": -1}, "spec_max_batch must be >= 0, got -1"),
    ({"max_resumes": -1}, "max_resumes must be >= 0, got -1"),
    ({"resume_wait_s": 0.0}, "resume_wait_s must be > 0, got 0.0"),
    ({"target_threads": -1}, "target_threads must be >= 0, got -1"),
    ({"scorer_address": "scorer.internal"}, "scorer_address: 'scorer.internal' is not host:port"),
    ({"scorer_address": "h:99999"}, "scorer_address: 'h:99999' is not host:port"),
    ({"scorer_tls_ca": "/tls/ca.crt"}, "scorer_tls_ca: set only with scorer_address"),
    ({"scorer_address": "h:1", "scorer_tls_server_name": "h"}, "scorer_tls_ca: needed with"),
    ({"scorer_address": "h:1", "scorer_tls_ca": "/c", "scorer_tls_cert": "/t"},
     "scorer_tls_cert, scorer_tls_key: a client certificate and its key go together"),
])
def test_bad_scorer_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServeAppSpec(**fields)


def test_scorer_state_bytes_rows_and_the_engine_batch_reach_the_config():
    """The Scorer's ``max_state_mb`` (bytes of trace history) and ``max_rows`` and the Target's
    ``max_num_seqs`` (engine batch: a Gambit run's capacity at most) were arguments no config could set;
    their defaults here are the constructors'."""
    import inspect

    from gambit.deployments.scorer import Scorer
    from gambit.deployments.target import Target
    from gambit.engine.config import EngineConfig
    from gambit.ops.serve_config import MAX_NUM_SEQS, MAX_ROWS, MAX_STATE_MB
    from gambit.scoring.scorer import MAX_STATE_MB as SCORING_MAX_STATE_MB

    def default(cls, name):
        return inspect.signature(cls.func_or_class.__init__).parameters[name].default

    assert MAX_STATE_MB == SCORING_MAX_STATE_MB == default(Scorer, "max_state_mb")
    assert MAX_ROWS == default(Scorer, "max_rows")
    assert MAX_NUM_SEQS == default(Target, "max_num_seqs") == EngineConfig.max_num_seqs
    for name in ("local", "kubernetes"):
        cfg = serve_config(profile(name, ServeAppSpec(max_state_mb=64, max_rows=512, max_num_seqs=32)))
        _schema_ok(cfg)
        target, scorer = _args(cfg)
        assert (scorer["max_state_mb"], scorer["max_rows"], target["max_num_seqs"]) == (64, 512, 32)
    target, scorer = _args(serve_config(ServeAppSpec()))
    assert (scorer["max_state_mb"], scorer["max_rows"], target["max_num_seqs"]) == (512, 4096, 256)


def test_an_outside_scorer_deploys_no_scorer_app():
    """With ``scorer_address`` no Target calls the scorer app, yet it was deployed (a Scorer replica
    holding CPU and memory, autoscaled for nothing)."""
    cfg = serve_config(profile("kubernetes", ServeAppSpec(scorer_address="scorer.example.internal:50061")))
    _schema_ok(cfg)
    assert [a["name"] for a in cfg["applications"]] == ["gambit"]
    assert set(_deployments(cfg)) == {"Coordinator", "Target"}
    assert [a["name"] for a in serve_config(ServeAppSpec())["applications"]] == ["gambit", "scorer"]
    # an outside Scorer's own rows limit is not known here: max_rows is not compared with max_num_seqs
    ServeAppSpec(scorer_address="h:1", max_rows=16)


@pytest.mark.parametrize("fields, message", [
    ({"max_state_mb": 0}, "max_state_mb must be >= 1, got 0"),
    ({"max_rows": 0}, "max_rows must be >= 1, got 0"),
    ({"max_num_seqs": 0}, "max_num_seqs must be >= 1, got 0"),
    ({"max_num_seqs": 4}, "max_num_seqs: 4 is below the default capacity 8: every Gambit request left"),
    ({"max_rows": 100}, "max_rows: 100 is below max_num_seqs 256: a step's boundaries"),
])
def test_bad_batch_and_state_settings_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServeAppSpec(**fields)


def test_the_upper_limits_are_the_charts():
    """The chart's values.schema.json caps maxRows and maxStateMb at 1048576, maxNumSeqs at 65536 and
    maxKeys at 2^31-1; ServeAppSpec and ServeConfig took any value, so a config `helm install` refuses was
    generated and served here. Now the same limits, one-line errors naming the field."""
    import json
    from pathlib import Path

    from gambit.deployments.local import ServeConfig
    from gambit.ops.serve_config import UPPER_LIMITS

    schema = json.loads((Path(__file__).parents[2] / "helm/gambit/values.schema.json").read_text())
    serve = schema["properties"]["serve"]["properties"]
    camel = {"max_keys": "maxKeys", "max_state_mb": "maxStateMb", "max_rows": "maxRows",
             "max_num_seqs": "maxNumSeqs"}
    assert UPPER_LIMITS == {k: serve[v]["maximum"] for k, v in camel.items()}
    for name, most in UPPER_LIMITS.items():
        over = {name: most + 1} | ({"max_rows": most + 1} if name == "max_num_seqs" else {})
        message = f"{name} must be at most {most} (the chart's limit), got {most + 1}"
        for cls in (ServeAppSpec, ServeConfig):
            with pytest.raises(ValueError, match="^" + re.escape(message)) as e:
                cls(**over)
            assert "\n" not in str(e.value)
    ServeAppSpec(**UPPER_LIMITS)  # each limit itself is taken (no width known here: no message check)


def test_a_scorer_call_over_the_grpc_message_cap_is_refused_at_config_time(monkeypatch):
    """4096 rows of an 8B model's width fit the 128 MiB gRPC cap of Serve's proxy; a wider model, or more
    rows, made every full Score call fail RESOURCE_EXHAUSTED, scored by the fallback, unguided. Refused
    naming max_rows and how far to lower it, unless the caps are raised in the environment."""
    from gambit.ops import serve_env

    ServeAppSpec(hidden_size=4096)  # the default max_rows, an 8B model: ~97 MiB
    message = "max_rows: 4096 rows of width 8192 make a Score call of up to 161 MiB, over the 128 MiB gRPC"
    with pytest.raises(ValueError, match="^" + re.escape(message) + ".* lower max_rows to 3035 or less"):
        ServeAppSpec(hidden_size=8192)
    ServeAppSpec(hidden_size=8192, max_rows=3035)
    with pytest.raises(ValueError, match="^max_rows: 3036 rows of width 8192"):
        ServeAppSpec(hidden_size=8192, max_rows=3036)
    ServeAppSpec(hidden_size=8192, scorer_address="h:1")  # an outside Scorer: its own rows limit
    for k in serve_env.PROXY_CAPS:  # raised where `gambit serve` hands Ray its environment
        monkeypatch.setenv(k, str(512 << 20))
    ServeAppSpec(hidden_size=8192)
    assert serve_env.message_cap() == serve_env.SCORER_ENDPOINT_MESSAGE_BYTES  # the direct endpoint's
    with pytest.raises(ValueError, match="^max_rows: 16384 rows of width 8192 .* over the 256 MiB"):
        ServeAppSpec(hidden_size=8192, max_rows=16384)
    monkeypatch.setenv(serve_env.PROXY_CAPS[0], "lots")
    with pytest.raises(ValueError, match="^RAY_SERVE_GRPC_MAX_MESSAGE_SIZE='lots' is not a number"):
        ServeAppSpec(hidden_size=8192)


def test_the_message_caps_are_the_serve_envs_and_the_scorers():
    """The sizes the check assumes: SERVE_ENV's caps, the client's send cap and a trace id's longest."""
    from gambit.ops import serve_env
    from gambit.serving import scorer_client
    from gambit.serving.payload import MAX_TRACE_ID_BYTES

    assert {int(serve_env.SERVE_ENV[k]) for k in serve_env.PROXY_CAPS} == {serve_env.GRPC_MAX_MESSAGE_BYTES}
    assert serve_env.EDIT_BYTES == 2 * scorer_client.MAX_PENDING * (2 * (MAX_TRACE_ID_BYTES + 2) + 2)
    assert serve_env.ROW_EXTRA_BYTES >= MAX_TRACE_ID_BYTES + 3 + 2 * 4  # id + framing, 2 packed floats
