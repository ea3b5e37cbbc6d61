"""What `gambit serve` hands the builders (``ServeConfig.app_args`` / ``scorer_args``) and what Ray Serve
makes of it: the Scorer's ``max_keys``, ``batch_wait_ms``, ``hidden_size`` and the Targets' outside (TLS)
Scorer, settable from the command line, reach the constructors; bad ones are refused before Ray starts."""

from __future__ import annotations

import argparse
import inspect
import re

import pytest

pytest.importorskip("ray.serve")

from ray.serve._private.build_app import build_app  # noqa: E402

from gambit.config_cli import from_args  # noqa: E402
from gambit.deployments.app import build_gambit, build_scorer  # noqa: E402
from gambit.deployments.local import ServeConfig  # noqa: E402
from gambit.deployments.scorer import Scorer  # noqa: E402
from gambit.deployments.target import Target  # noqa: E402
from gambit.serving.commands import add_commands  # noqa: E402


def _serve_flags(*argv: str) -> ServeConfig:
    parser = argparse.ArgumentParser(prog="gambit")
    add_commands(parser.add_subparsers(dest="cmd"))
    return from_args(ServeConfig, parser.parse_args(["serve", *argv]))


def _init_kwargs(app, name: str) -> dict:
    (dep,) = [d for d in build_app(app, name="x").deployments if d.name == name]
    return dep.init_kwargs


def _params(cls) -> set[str]:
    return set(inspect.signature(cls.func_or_class.__init__).parameters)


def test_scorer_flags_reach_the_scorer():
    """`gambit serve` passed the Scorer its spec, token and model only: --batch-wait-ms and --hidden-size
    (ServeAppSpec and the chart had them) and the Scorer's max_keys could not be set at all."""
    cfg = _serve_flags("--max-keys", "1000", "--batch-wait-ms", "2", "--hidden-size", "576")
    got = _init_kwargs(build_scorer(cfg.scorer_args()), "Scorer")
    assert (got["max_keys"], got["batch_wait_ms"], got["hidden_size"]) == (1000, 2.0, 576)
    assert set(got) <= _params(Scorer)
    assert _init_kwargs(build_scorer(ServeConfig().scorer_args()), "Scorer")["max_keys"] == 65_536


def test_scorer_max_keys_default_is_the_scorers():
    from gambit.scoring.scorer import MAX_KEYS

    assert ServeConfig().max_keys == MAX_KEYS


def test_an_outside_tls_scorer_reaches_the_targets(self_signed_cert):
    cert, _ = self_signed_cert("localhost")
    cfg = _serve_flags("--scorer-address", "127.0.0.1:50061", "--scorer-tls-ca", str(cert),
                       "--scorer-tls-server-name", "localhost")
    target = _init_kwargs(build_gambit(cfg.app_args() | {"target_gpus": 0}), "Target")
    assert (target["scorer_address"], target["scorer_app"], target["scorer_tls_ca"],
            target["scorer_tls_server_name"]) == ("127.0.0.1:50061", "", str(cert), "localhost")
    assert set(target) <= _params(Target)
    plain = ServeConfig().app_args()["target"]  # the default: the scorer app through the proxy
    assert (plain["scorer_address"], plain["scorer_app"], plain["scorer_tls_ca"]) == ("127.0.0.1:9000",
                                                                                       "scorer", "")


@pytest.mark.parametrize("fields, message", [
    ({"max_keys": 0}, "max_keys must be >= 1, got 0"),
    ({"batch_wait_ms": 40000}, "batch_wait_ms must be at most 1000"),
    ({"hidden_size": -1}, "hidden_size must be >= 0, got -1"),
    ({"max_resumes": -1}, "max_resumes must be >= 0, got -1"),
    ({"resume_wait_s": 0}, "resume_wait_s must be > 0, got 0"),
    ({"scorer_address": "nohost"}, "scorer_address: 'nohost' is not host:port"),
    ({"scorer_tls_ca": "/x/ca.pem"}, "scorer_tls_ca: set only with scorer_address"),
    ({"scorer_address": "h:1", "scorer_tls_ca": "/nonexistent/ca.pem"},
     "scorer_tls_ca: file /nonexistent/ca.pem does not exist"),
])
def test_bad_scorer_flags_are_refused_before_ray_starts(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServeConfig(**fields)


def test_takeover_settings_reach_the_coordinator_from_the_flags_and_the_serve_config():
    """The Coordinator's ``max_resumes`` / ``resume_wait_s`` (takeovers after a Target replica is lost) and
    the Target's ``threads`` in ServeAppSpec had no surface: ``build_gambit`` never passed the first two."""
    from gambit.deployments.coordinator import Coordinator
    from gambit.ops.serve_config import ServeAppSpec, profile, serve_config

    cfg = _serve_flags("--max-resumes", "0", "--resume-wait-s", "30", "--target-threads", "4")
    app = build_gambit(cfg.app_args() | {"target_gpus": 0})
    coord = _init_kwargs(app, "Coordinator")
    assert (coord["max_resumes"], coord["resume_wait_s"]) == (0, 30.0)
    assert _init_kwargs(app, "Target")["threads"] == 4
    spec = ServeAppSpec(max_resumes=5, resume_wait_s=10.0, target_threads=8)
    args = serve_config(profile("kubernetes", spec))["applications"][0]["args"]
    app = build_gambit(args)
    coord = _init_kwargs(app, "Coordinator")
    assert (coord["max_resumes"], coord["resume_wait_s"]) == (5, 10.0)
    assert _init_kwargs(app, "Target")["threads"] == 8
    assert set(coord) - {"target"} <= _params(Coordinator)
    default = _init_kwargs(build_gambit(ServeConfig().app_args() | {"target_gpus": 0}), "Coordinator")
    assert (default["max_resumes"], default["resume_wait_s"]) == (2, 120.0)  # the Coordinator's defaults


def test_state_bytes_rows_and_the_engine_batch_reach_the_scorer_and_the_target():
    """The Scorer's ``max_state_mb`` (bytes of trace history a sequence scorer keeps) and ``max_rows``
    and the Target's ``max_num_seqs`` (a Gambit request's capacity at most) had no `gambit serve` flag."""
    cfg = _serve_flags("--max-state-mb", "64", "--max-rows", "512", "--max-num-seqs", "32")
    scorer = _init_kwargs(build_scorer(cfg.scorer_args()), "Scorer")
    assert (scorer["max_state_mb"], scorer["max_rows"]) == (64, 512)
    assert set(scorer) <= _params(Scorer)
    target = _init_kwargs(build_gambit(cfg.app_args() | {"target_gpus": 0}), "Target")
    assert target["max_num_seqs"] == 32 and set(target) <= _params(Target)
    default = ServeConfig()
    assert (default.max_state_mb, default.max_rows, default.max_num_seqs) == tuple(
        inspect.signature(c.func_or_class.__init__).parameters[n].default
        for c, n in ((Scorer, "max_state_mb"), (Scorer, "max_rows"), (Target, "max_num_seqs")))


def test_the_scorer_deployment_applies_max_state_mb(monkeypatch):
    """The Ray Scorer set a sequence scorer's ``max_keys`` only: its bytes cap stayed 512 MiB."""
    from gambit.deployments import scorer as scorer_mod

    monkeypatch.setattr(scorer_mod, "ray_metrics", lambda names: None)
    s = Scorer.func_or_class(scorer="random:sequence:16", hidden_size=16, direct_host="", token_env="",
                             max_keys=10, max_state_mb=3)
    try:
        assert (s.core.scorer.max_keys, s.core.scorer.max_state_mb) == (10, 3)
    finally:
        s.core.close()
    with pytest.raises(ValueError, match="^Scorer: max_state_mb must be >= 1, got 0"):
        Scorer.func_or_class(scorer="random:sequence:16", hidden_size=16, direct_host="", max_state_mb=0)


@pytest.mark.parametrize("fields, message", [
    ({"max_state_mb": 0}, "max_state_mb must be >= 1, got 0"),
    ({"max_rows": 0}, "max_rows must be >= 1, got 0"),
    ({"max_num_seqs": 0}, "max_num_seqs must be >= 1, got 0"),
    ({"max_num_seqs": 4}, "max_num_seqs: 4 is below the default capacity 8"),
    ({"max_num_seqs": 16, "capacity": 32}, "max_num_seqs: 16 is below the default capacity 32"),
    ({"max_rows": 100}, "max_rows: 100 is below max_num_seqs 256"),
])
def test_bad_batch_and_state_flags_are_refused_before_ray_starts(fields, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ServeConfig(**fields)


def test_an_outside_scorer_starts_no_scorer_app_and_is_not_waited_for(monkeypatch):
    """`gambit serve --scorer-address` deployed the scorer app no Target calls, and waited for it."""
    import ray
    from ray import serve

    from gambit.deployments import local

    deployed, waited = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray started, nothing checked
    monkeypatch.setattr(serve, "start", lambda **kw: None)
    monkeypatch.setattr(local, "_deploy", lambda app, name: deployed.append(name))
    monkeypatch.setattr(local, "wait_ready", lambda *a, **kw: waited.append(kw.get("scorer", True)))
    local.start(ServeConfig(scorer_address="127.0.0.1:50061", target_gpus=0))
    assert (deployed, waited) == (["gambit"], [False])
    deployed.clear()
    waited.clear()
    local.start(ServeConfig(target_gpus=0))
    assert (deployed, waited) == (["scorer", "gambit"], [True])


@pytest.fixture
def proxy_routing():
    """A stand-in for Serve's proxy: ``ListApplications`` answers the names in the list it yields."""
    from concurrent import futures

    import grpc
    from ray.serve.generated import serve_pb2, serve_pb2_grpc

    names: list[str] = []

    class Api(serve_pb2_grpc.RayServeAPIServiceServicer):
        def ListApplications(self, request, context):  # noqa: N802
            return serve_pb2.ListApplicationsResponse(application_names=names)

    server = grpc.server(futures.ThreadPoolExecutor(2))
    serve_pb2_grpc.add_RayServeAPIServiceServicer_to_server(Api(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield names, f"127.0.0.1:{port}"
    server.stop(0)


def test_wait_ready_without_a_scorer_app_waits_for_the_gambit_app_alone(proxy_routing):
    from gambit.deployments.local import wait_ready

    names, address = proxy_routing
    names.append("gambit")
    wait_ready(address, 5, scorer=False)
    wait_ready(address, 5, scorer=None)  # a server already up: whatever it routes
    with pytest.raises(TimeoutError, match="not yet 'gambit' and 'scorer'"):
        wait_ready(address, 0.5)


def test_rows_over_the_grpc_message_cap_are_refused_before_ray_starts():
    """`gambit serve --max-rows` with a wide model: every full Score call was over the proxy's 128 MiB
    message cap and fell back unguided. The width is --hidden-size, else the model's."""
    with pytest.raises(ValueError, match=r"^max_rows: 4096 rows of width 8192 .* lower max_rows to 3035"):
        ServeConfig(hidden_size=8192)
    assert _serve_flags("--hidden-size", "8192", "--max-rows", "3035").max_rows == 3035
    with pytest.raises(SystemExit, match=r"^gambit serve: error: --max-rows: 4096 rows of width 8192 make a"):
        _serve_flags("--hidden-size", "8192")
    with pytest.raises(ValueError, match=r"^max_rows: 1048576 rows of width \d+ make a Score call"):
        ServeConfig(max_rows=1 << 20)  # the shipped target's width
    with pytest.raises(SystemExit, match=r"^gambit serve: error: --max-rows must be at most 1048576 \("):
        _serve_flags("--max-rows", str((1 << 20) + 1))


def test_the_ray_scorer_refuses_rows_over_the_grpc_message_cap_at_start(monkeypatch):
    """A Scorer deployed from a hand-written serve config (or the chart) skipped `gambit serve`'s check:
    it started and then every full Score call was over the proxy's message cap, scored by the fallback.
    The replica checks with its node's caps (the environment Ray started with), its scorer's width."""
    from gambit.deployments import scorer as scorer_mod
    from gambit.ops.serve_env import PROXY_CAPS

    monkeypatch.setattr(scorer_mod, "ray_metrics", lambda names: None)
    for k in PROXY_CAPS:
        monkeypatch.delenv(k, raising=False)  # SERVE_ENV's 128 MiB
    message = ("Scorer: max_rows: 1048576 rows of width 16 make a Score call of up to 237 MiB, over the "
               "128 MiB gRPC message cap; lower max_rows to 489592 or less, or raise "
               "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE and RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH")
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        Scorer.func_or_class(scorer="random:mlp:16", hidden_size=16, direct_host="", token_env="",
                             max_rows=1 << 20)
    for k in PROXY_CAPS:  # raised where Ray was started: the same rows fit
        monkeypatch.setenv(k, str(256 << 20))
    s = Scorer.func_or_class(scorer="random:mlp:16", hidden_size=16, direct_host="", token_env="",
                             max_rows=1 << 20)
    s.core.close()
