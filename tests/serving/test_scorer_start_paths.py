"""The Scorer's start paths (`gambit scorer serve`, the Ray deployment) with odd settings: each refused
naming the setting, and nothing left running after a failed start."""

from __future__ import annotations

import socket

import pytest

from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server


def test_the_scorer_server_refuses_one_port_for_grpc_and_metrics():
    """It started the gRPC server, then failed "[Errno 98] Address already in use", naming neither."""
    with pytest.raises(ValueError, match="port and metrics_port are both 50999; they must differ"):
        ScorerServerConfig(port=50999, metrics_port=50999)
    ScorerServerConfig(port=0, metrics_port=0)  # 0: any free one, each its own


def test_a_busy_metrics_port_names_it_and_leaves_no_server_running():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        cfg = ScorerServerConfig(scorer="random:mlp", port=port, metrics_port=busy, token_env="")
        with pytest.raises(OSError, match=f"^metrics_port {busy}: cannot listen on 127.0.0.1"):
            start_scorer_server(cfg)
    with socket.socket() as again:  # the gRPC server was stopped: its port is free again
        again.bind(("127.0.0.1", port))


def test_the_scorer_server_builds_its_scorer_with_its_bounds():
    srv = start_scorer_server(ScorerServerConfig(scorer="random:sequence", port=0, metrics_port=-1,
                                                 token_env="", max_keys=3, max_state_mb=2))
    try:
        assert (srv.core.scorer.max_keys, srv.core.scorer.max_state_mb) == (3, 2)
    finally:
        srv.stop()


@pytest.mark.parametrize("kwargs, message", [
    ({"scorer": "confidence", "max_keys": 1.5}, "Scorer: max_keys must be a whole number, got 1.5"),
    ({"scorer": "confidence", "max_rows": 2.5}, "Scorer: max_rows must be a whole number, got 2.5"),
    ({"scorer": "random:mlp", "hidden_size": -1}, "Scorer: hidden_size must be >= 0, got -1"),
])
def test_the_ray_scorer_refuses_odd_settings_naming_them(kwargs, message):
    from gambit.deployments.scorer import Scorer

    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        Scorer.func_or_class(direct_host="", **kwargs)


def test_the_ray_scorer_builds_its_scorer_with_its_bounds():
    from gambit.deployments.scorer import Scorer

    dep = Scorer.func_or_class(scorer="random:sequence:16", max_keys=4, max_state_mb=9, direct_host="")
    try:
        assert (dep.core.scorer.max_keys, dep.core.scorer.max_state_mb) == (4, 9)
    finally:
        dep.core.close()
