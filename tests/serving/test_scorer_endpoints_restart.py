"""A Target's direct Scorer endpoint across a Scorer restart, over real gRPC: the restart costs at most one
failed call on the dead endpoint, whether the replica comes back on another port or on the same one, and
no call falls back unguided while the proxy answers."""

import threading
import time

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

H = 16
X = torch.randn(4, H, generator=torch.Generator().manual_seed(0))


def start(port: int = 0):
    cfg = ScorerServerConfig(port=port, metrics_port=-1, token_env="", batch_wait_ms=0)
    return start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=3))


class Resolver:
    """The Ray handle call: the live replica's address, read when the look-up begins; ``hold`` keeps
    a look-up under way (it read its address already) until ``release`` is set."""

    def __init__(self, address: str) -> None:
        self.address, self.hold, self.release = address, False, threading.Event()

    def __call__(self) -> str:
        got = self.address
        if self.hold:
            self.release.wait(5)
        return got


def settle(client) -> None:
    """Wait for a background look-up to end (bounded)."""
    for _ in range(200):
        if not client._resolving:
            return
        time.sleep(0.01)


def direct_failures(client) -> list:
    """Record each Score call on a direct endpoint (any stub but the proxy's) that failed."""
    failed, call = [], client._call

    def counted(stub, req, n):
        got = call(stub, req, n)
        if got is None and stub is not client.stub:
            failed.append(client.last_error)
        return got

    client._call = counted
    return failed


@pytest.fixture
def proxy():
    """Stands for Serve's proxy: always answers (it routes to a live replica)."""
    srv = start()
    yield srv
    srv.stop(0)


def scores_flow_again(client, calls: int = 6) -> None:
    for i in range(calls):
        assert client.score([f"t{i}"], X[i % 4:i % 4 + 1]).shape == (1,)
        settle(client)


@pytest.mark.parametrize("same_port", [False, True])
def test_a_scorer_restart_costs_at_most_one_failed_direct_call(proxy, same_port):
    old = start()
    resolver = Resolver(f"127.0.0.1:{old.port}")
    client = RemoteScorer(f"127.0.0.1:{proxy.port}", H, resolve=resolver, timeout_s=2.0)
    new = None
    try:
        settle(client)
        scores_flow_again(client, 2)
        assert client.direct == resolver.address and client.direct_calls == 2
        failed = direct_failures(client)
        resolver.hold = True  # a periodic look-up is under way as the replica goes: it read the old address
        client._resolve_at = 0.0  # refresh_s is over
        client.score(["a"], X[0:1])
        assert client._resolving
        old.stop(0)
        client.score(["b"], X[1:2])  # fails on the dead endpoint, lands through the proxy
        assert len(failed) == 1 and client.fallbacks == 0
        new = start(old.port if same_port else 0)
        resolver.address, resolver.hold = f"127.0.0.1:{new.port}", False
        resolver.release.set()
        settle(client)
        before = client.direct_calls
        scores_flow_again(client)
        # before: the stale look-up put the dead address back (tried, and failed, first on the next call);
        # on the same port the old channel waited out its reconnect back-off, each call failing on it
        assert failed == failed[:1], failed
        assert client.fallbacks == 0, client.last_error
        assert client.direct == resolver.address and client.direct_calls > before
    finally:
        client.close()
        if new is not None:
            new.stop(0)


def test_a_refused_call_keeps_the_direct_endpoint(proxy):
    """INVALID_ARGUMENT from the direct endpoint: the same ScorerCore behind the proxy refuses it too. It
    was taken for a replica gone: the endpoint dropped, the call sent again through the proxy, and a
    look-up (a Ray handle call) made."""
    srv = start()
    resolver = Resolver(f"127.0.0.1:{srv.port}")
    client = RemoteScorer("127.0.0.1:1", H, resolve=resolver, retry_after_s=0.0)  # the proxy: unreachable
    try:
        settle(client)
        assert client.score(["a"], X[0:1]).shape == (1,) and client.direct_calls == 1
        assert client.score(["b" * 200], X[1:2]).tolist() == [0.5]  # an id over 128 bytes: refused
        assert client.last_error.startswith("INVALID_ARGUMENT"), client.last_error
        assert client.direct == resolver.address
    finally:
        client.close()
        srv.stop(0)


def test_a_direct_channel_closed_under_the_info_call_takes_the_proxy(proxy):
    """Another thread closed the direct endpoint's channel (LRU eviction, or its replica's failure) between
    the look-up of its stub and the Info call: the ValueError ("closed channel") escaped ``score``."""
    srv = start()
    client = RemoteScorer(f"127.0.0.1:{proxy.port}", H)
    stub = client._stub
    try:
        client.direct = f"127.0.0.1:{srv.port}"

        def closed_meanwhile(address):
            got = stub(address)
            if address == client.direct:
                got[0].close()
            return got

        client._stub = closed_meanwhile
        assert client.score(["a"], X[0:1]).shape == (1,)
        assert client.fallbacks == 0 and client.direct == ""
    finally:
        client.close()
        srv.stop(0)
