"""A boundary state the Scorer refuses (NaN, infinity, |value| past float16's range, a feature above 0)
costs its own score, not its call's: the other rows are scored, it gets its trace's running mean, in
process and over gRPC alike. One such row refused the whole call (every trace 0.5, the client backed
off for a second and more) or, in process, raised and failed the driver's step."""

import threading

import grpc
import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.local_scorer import LocalScorer
from gambit.serving.metrics import Metrics, PrometheusBackend
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_core import bad_rows
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

H = 16
X = torch.randn(8, H, generator=torch.Generator().manual_seed(0))
BAD = {"nan": float("nan"), "inf": float("inf"), "huge": 1e6}


@pytest.fixture(scope="module")
def server():
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0)
    srv = start_scorer_server(cfg, scorer=random_scorer("sequence", H, seed=3))
    yield srv
    srv.stop()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_bad_rows_are_found_in_every_dtype_and_layout(dtype):
    x = torch.cat([X[:5], -torch.rand(5, 2, generator=torch.Generator().manual_seed(1))], 1)
    x[1, 0], x[3, H + 1], x[4, 2] = float("nan"), 0.5, -1e6
    x = x.to(dtype)
    assert bad_rows(x, H) == [1, 3, 4] and bad_rows(x[:, :H], H) == [1, 4]
    assert bad_rows(x.t().contiguous().t(), H) == [1, 3, 4] and bad_rows(x[[0, 2]], H) == []


def scorers(server):
    """The remote and the in-process path over the same sequence scorer."""
    return {"remote": RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence", retry_after_s=60.0),
            "local": LocalScorer(random_scorer("sequence", H, seed=3))}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("path", ["remote", "local", "remote-async"])
def test_a_bad_row_costs_its_own_score_not_the_others(server, path, bad):
    client = scorers(server)[path.split("-")[0]]
    ref = random_scorer("sequence", H, seed=3)
    p = f"{path}:{bad}:"  # the server's histories are shared by the module's tests
    score = (lambda k, x: client.score_async(k, x).result(30)) if path.endswith("async") else client.score
    try:
        first = score([p + "a", p + "b"], X[0:2])
        ref.score([p + "a", p + "b"], X[0:2])
        x = X[2:5].clone()
        x[1, 3] = BAD[bad]
        got = score([p + "a", p + "b", p + "c"], x)
        want = ref.score([p + "a", p + "c"], x[[0, 2]])  # b's history did not take the bad row
        assert got[[0, 2]].tolist() == pytest.approx(want.tolist(), abs=1e-6)
        assert got[1].item() == pytest.approx(first[1].item())  # b's running mean
        assert client.fallbacks == 0 and client.bad_rows == 1
        again = score([p + "b"], X[5:6])  # not backed off: scored at once, from b's history
        assert again.tolist() == pytest.approx(ref.score([p + "b"], X[5:6]).tolist(), abs=1e-6)
        assert client.fallbacks == 0
    finally:
        getattr(client, "close", lambda: None)()


def test_every_row_bad_is_a_call_of_none_that_still_carries_the_forks(server):
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence", retry_after_s=60.0)
    try:
        client.score(["all:p"], X[0:1])
        client.fork("all:p", "all:c")
        assert client.score(["all:c"], torch.full((1, H), float("nan"))).tolist() == [pytest.approx(
            client._mean("all:p"))]
        assert client.fallbacks == 0 and client._forks == []  # the fork went with the call of no rows
    finally:
        client.close()


def test_a_bad_confidence_feature_is_a_bad_row_too():
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0),
                              scorer=random_scorer("mlp", H, seed=1, confidence=True))
    client = RemoteScorer(f"127.0.0.1:{srv.port}", H, confidence=True, retry_after_s=60.0)
    local = LocalScorer(random_scorer("mlp", H, seed=1, confidence=True))
    x = torch.cat([X[:3], -torch.rand(3, 2, generator=torch.Generator().manual_seed(1))], 1)
    x[1, H] = 0.5  # a log-probability above 0
    x[2, H + 1] = float("nan")
    try:
        got, ref = client.score(["f:a", "f:b", "f:c"], x), local.score(["f:a", "f:b", "f:c"], x)
        assert got.tolist() == ref.tolist() and got[1:].tolist() == [0.5, 0.5]
        assert client.fallbacks == 0 and client.bad_rows == local.bad_rows == 2
    finally:
        client.close()
        srv.stop()


def test_the_scorer_names_the_rows_it_refuses(server):
    pb2, pb2_grpc = load("scorer")
    x = X[:6].clone()
    x[1, 0], x[4, 2] = float("nan"), float("-inf")
    raw, dtype, shape = encode_states(x)
    stub = pb2_grpc.ScorerServiceStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))
    with pytest.raises(grpc.RpcError) as e:
        stub.Score(pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape,
                                    trace_ids=[f"n:{i}" for i in range(6)]), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "rows [1, 4], trace_ids ['n:1', 'n:4']" in e.value.details()


def test_queued_calls_of_several_dtypes_go_together_as_float32(server):
    """The sender refused the merged call ("queued states differ in dtype"): every caller's future
    raised, and the driver's step with it."""
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence")
    ref = random_scorer("sequence", H, seed=3)
    client._sender = sender = threading.Thread(target=client._send_loop, daemon=True)  # none started yet
    xs = [X[0:2].bfloat16(), X[2:3], X[3:5].half()]
    keys = [["d:a", "d:b"], ["d:a"], ["d:c", "d:b"]]
    try:
        futs = [client.score_async(k, x) for k, x in zip(keys, xs, strict=True)]
        sender.start()  # all three leave in one call
        for f, k, x in zip(futs, keys, xs, strict=True):
            assert f.result(30).tolist() == pytest.approx(ref.score(k, x.float()).tolist(), abs=1e-6)
        assert client.calls == 1 and client.fallbacks == 0
    finally:
        client.close()


@pytest.mark.parametrize("path", ["remote", "local", "remote-async"])
def test_bad_rows_are_counted_in_the_metrics_every_call(server, path):
    """The rows left out were a count on the client and a log line a minute: a Target emitting NaN
    everywhere failed no call, so gambit_scorer_fallback_total and its alert stayed quiet (an outage no
    panel showed). Each left-out row is counted in gambit_scorer_bad_rows_total, not only the first
    call's of a minute."""
    backend = PrometheusBackend()
    metrics = Metrics(backend)
    client = (RemoteScorer(f"127.0.0.1:{server.port}", H, kind="sequence", retry_after_s=60.0,
                           metrics=metrics)
              if path.startswith("remote") else LocalScorer(random_scorer("sequence", H, seed=3), metrics))
    score = (lambda k, x: client.score_async(k, x).result(30)) if path.endswith("async") else client.score
    count = lambda n: backend.registry.get_sample_value(f"gambit_scorer_{n}_total")  # noqa: E731
    p = f"metric-{path}:"
    try:
        score([p + "a", p + "b"], X[0:2])
        assert count("bad_rows") == 0
        x = X[2:5].clone()
        x[0, 1], x[2, 0] = float("nan"), float("inf")
        score([p + "a", p + "b", p + "c"], x)
        score([p + "b"], torch.full((1, H), 1e6))  # within the minute the warning is not said again
        assert count("bad_rows") == 3 == client.bad_rows
        assert not count("fallback") and client.fallbacks == 0
    finally:
        getattr(client, "close", lambda: None)()
