"""The standalone ScorerService over real gRPC: scores, batching, validation, auth, TLS, health,
reflection and the metrics port."""

import re
import threading
import time
import urllib.request

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gambit.scoring import random_scorer
from gambit.scoring.scorer import MAX_STATE_MB
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_core import ScorerCore
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
from gambit.serving.security import open_channel

H = 16
pb2, pb2_grpc = load("scorer")


@pytest.fixture(scope="module")
def server(monkeypatch_module):
    monkeypatch_module.setenv("GAMBIT_TEST_TOKEN", "s3cret")
    cfg = ScorerServerConfig(port=0, metrics_port=0, token_env="GAMBIT_TEST_TOKEN", batch_wait_ms=20)
    srv = start_scorer_server(cfg, scorer=random_scorer("sequence", H, seed=3))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def stub(srv):
    return pb2_grpc.ScorerServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.port}"))


AUTH = (("authorization", "Bearer s3cret"),)


def request(states, ids, **kw):
    raw, dtype, shape = encode_states(states)
    return pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=ids, **kw)


def test_scores_equal_in_process_scorer_and_keep_history(server):
    ref = random_scorer("sequence", H, seed=3)
    x = torch.randn(6, H)
    ids = ["r:1", "r:2", "r:1", "r:3", "r:1", "r:2"]
    got = stub(server).Score(request(x, ids), metadata=AUTH).scores
    want = ref.score(ids, x)
    assert torch.allclose(torch.tensor(list(got)), want, atol=1e-6)
    # a fork carries r:1's history to r:9; the server state must match the reference's
    y = torch.randn(2, H)
    ref.fork("r:1", "r:9")
    got = stub(server).Score(request(y, ["r:9", "r:1"], forks=[pb2.Fork(parent="r:1", child="r:9")],
                                     drops=["r:1", "r:2", "r:3", "r:9"]), metadata=AUTH).scores
    assert torch.allclose(torch.tensor(list(got)), ref.score(["r:9", "r:1"], y), atol=1e-6)
    assert server.core.scorer.num_keys == 0  # drops applied


def test_concurrent_requests_are_batched(server):
    calls0 = server.core.calls
    xs = [torch.randn(3, H) for _ in range(8)]
    out = [None] * 8

    def call(i):
        out[i] = list(stub(server).Score(request(xs[i], [f"b{i}:{j}" for j in range(3)],
                                                 drops=[f"b{i}:{j}" for j in range(3)]),
                                                 metadata=AUTH).scores)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    ref = random_scorer("sequence", H, seed=3)
    for i in range(8):  # each request's scores are its own alone, bit for bit, however it was batched
        assert torch.equal(torch.tensor(out[i]), ref.score([f"b{i}:{j}" for j in range(3)], xs[i]))
    assert server.core.calls - calls0 <= 8
    # requests queued together are scored by one forward (checked on the core, without thread timing)
    core = ScorerCore(random_scorer("mlp", H, seed=1), batch_wait_s=0.2)
    xs = [torch.randn(2, H) for _ in range(6)]
    jobs = [core.validate(*encode_states(x), [f"c{i}", f"d{i}"]) for i, x in enumerate(xs)]
    futs = [core.submit(j) for j in jobs]
    assert [len(f.result(30)) for f in futs] == [2] * 6 and core.calls == 1
    alone = random_scorer("mlp", H, seed=1)  # each request's rows score as they do alone
    for f, x in zip(futs, xs, strict=True):
        assert torch.equal(torch.tensor(list(f.result())), alone.score([0, 1], x))
    core.close()


@pytest.mark.parametrize("mutate,field", [
    (lambda r: setattr(r, "dtype", "float64"), "dtype"),
    (lambda r: r.shape.__setitem__(1, H + 1), "shape"),
    (lambda r: setattr(r, "states", r.states[:-4]), "states"),
    (lambda r: r.trace_ids.append("extra"), "trace_ids"),
])
def test_malformed_payload_is_invalid_argument_naming_the_field(server, mutate, field):
    req = request(torch.randn(2, H), ["a", "b"])
    mutate(req)
    with pytest.raises(grpc.RpcError) as e:
        stub(server).Score(req, metadata=AUTH)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith(f"{field}:")


def test_bearer_token_is_required(server):
    for md in ((), (("authorization", "Bearer wrong"),)):
        with pytest.raises(grpc.RpcError) as e:
            stub(server).Info(pb2.InfoRequest(), metadata=md)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub(server).Info(pb2.InfoRequest(), metadata=AUTH).hidden_size == H


def test_health_reflection_and_metrics(server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    hs = health_pb2_grpc.HealthStub(ch)
    for name in ("", "gambit.v1.ScorerService"):
        status = hs.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(ch)
    resp = next(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in resp.list_services_response.service}
    assert {"gambit.v1.ScorerService", "grpc.health.v1.Health"} <= names
    stub(server).Score(request(torch.randn(4, H), list("wxyz"), drops=list("wxyz")), metadata=AUTH)
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(lines["gambit_scorer_latency_seconds_count"]) >= 1
    assert float(lines["gambit_scorer_batch_size_sum"]) >= 4
    assert float(lines['gambit_request_errors_total{code="INVALID_ARGUMENT",rpc="Score"}']) >= 1


def test_refused_tokens_are_counted_and_drops_travel_alone(server):
    """The token interceptor answered UNAUTHENTICATED before the servicer counted anything (the Ray
    deployment counts it); a request of N = 0 rows (drops only) was INVALID_ARGUMENT."""
    def count(rpc):
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(f'gambit_request_errors_total{{code="UNAUTHENTICATED",rpc="{rpc}"}}'))

    before = count("Score"), count("Info")
    for md in ((), (("authorization", "Bearer wrong"),)):
        with pytest.raises(grpc.RpcError):
            stub(server).Score(request(torch.randn(1, H), ["u:1"]), metadata=md)
    with pytest.raises(grpc.RpcError):
        stub(server).Info(pb2.InfoRequest())
    assert (count("Score"), count("Info")) == (before[0] + 2, before[1] + 1)
    stub(server).Score(request(torch.randn(2, H), ["u:1", "u:2"]), metadata=AUTH)
    keys = server.core.scorer.num_keys
    empty = pb2.ScoreRequest(states=b"", dtype="float32", shape=[0, H], drops=["u:1", "u:2"])
    assert list(stub(server).Score(empty, metadata=AUTH).scores) == []
    assert server.core.scorer.num_keys == keys - 2


def test_a_batch_wait_past_a_targets_timeout_is_refused():
    """--batch-wait-ms 40000 was taken: every call then failed after 30 s with "scoring failed: "."""
    with pytest.raises(ValueError, match="batch_wait_ms must be at most 1000"):
        ScorerServerConfig(batch_wait_ms=40000)
    assert ScorerServerConfig(batch_wait_ms=1000).batch_wait_ms == 1000


@pytest.mark.parametrize("ms, message", [(40000, "Scorer: batch_wait_ms must be at most 1000"),
                                         (float("nan"), "Scorer: batch_wait_ms must be"),
                                         (-1, "Scorer: batch_wait_ms must be")])
def test_the_ray_scorer_deployment_bounds_its_batch_wait_too(ms, message):
    """The Ray deployment took any wait (the chart's serve.batchWaitMs): every call then failed."""
    from gambit.deployments.scorer import Scorer

    with pytest.raises(ValueError, match=message):
        Scorer.func_or_class(scorer="random:mlp:192", batch_wait_ms=ms, direct_host="")
    ok = Scorer.func_or_class(scorer="random:mlp:192", batch_wait_ms=1000, direct_host="")
    assert ok.core.batch_wait_s == 1.0
    ok.core.close()


def test_max_keys_bounds_a_served_sequence_scorer_and_its_evictions_are_exported():
    """`gambit scorer serve` had no --max-keys (a sequence scorer kept 65536 histories) and no metric."""
    with pytest.raises(ValueError, match="max_keys must be >= 1, got 0"):
        ScorerServerConfig(max_keys=0)
    cfg = ScorerServerConfig(scorer=f"random:sequence:{H}", port=0, metrics_port=-1, token_env="",
                             max_keys=3)
    srv = start_scorer_server(cfg)
    try:
        assert srv.core.scorer.max_keys == 3
        client = RemoteScorer(f"127.0.0.1:{srv.port}", H)
        client.score(["a", "b", "c", "d", "e"], torch.randn(5, H))
        assert srv.core.scorer.num_keys == 3
        assert "gambit_scorer_evictions_total 2.0" in srv.metrics_backend.exposition().decode()
    finally:
        srv.stop()
    from gambit.deployments.scorer import Scorer  # the Ray deployment takes it too

    with pytest.raises(ValueError, match="Scorer: max_keys must be >= 1"):
        Scorer.func_or_class(scorer="random:sequence:192", max_keys=0, direct_host="")
    dep = Scorer.func_or_class(scorer="random:sequence:192", max_keys=7, direct_host="")
    assert dep.core.scorer.max_keys == 7
    dep.core.close()


def test_max_state_mb_bounds_the_bytes_a_served_sequence_scorer_keeps():
    """An attn history grows a row per boundary: the key cap alone did not bound a Scorer's memory."""
    with pytest.raises(ValueError, match="max_state_mb must be >= 1, got 0"):
        ScorerServerConfig(max_state_mb=0)
    cfg = ScorerServerConfig(scorer=f"random:sequence:{H}", port=0, metrics_port=-1, token_env="",
                             max_state_mb=3)
    srv = start_scorer_server(cfg)
    try:
        assert srv.core.scorer.max_state_mb == 3
    finally:
        srv.stop()
    from gambit.deployments.scorer import Scorer  # the Ray deployment keeps the scorer's default

    dep = Scorer.func_or_class(scorer="random:sequence:192", direct_host="")
    assert dep.core.scorer.max_state_mb == MAX_STATE_MB
    dep.core.close()


def test_tls_server_and_remote_scorer_client(self_signed_cert):
    crt, key = self_signed_cert("localhost")
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", tls_cert=str(crt), tls_key=str(key))
    srv = start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=1))
    try:
        client = RemoteScorer(f"localhost:{srv.port}", H, tls_ca=str(crt))
        x = torch.randn(3, H)
        assert torch.allclose(client.score(["a", "b", "c"], x), random_scorer("mlp", H, seed=1).score([0, 1,
                                                                                                       2], x),
                              atol=1e-6)
        assert client.fallbacks == 0
        with pytest.raises(grpc.RpcError):  # a plaintext client cannot talk to it
            pb2_grpc.ScorerServiceStub(open_channel(f"localhost:{srv.port}")).Info(pb2.InfoRequest(),
                                                                                   timeout=5)
    finally:
        srv.stop()


def test_unreachable_scorer_falls_back_to_running_means():
    client = RemoteScorer("127.0.0.1:1", H, timeout_s=0.5, retry_after_s=0.0)
    out = client.score(["a", "b"], torch.randn(2, H))
    assert out.tolist() == [0.5, 0.5] and client.fallbacks == 1
    client._sum["a"] = (1.5, 2)  # the scorer gave "a" 0.75 on average before it went away
    assert client.score(["a"], torch.randn(1, H)).tolist() == [0.75]


def test_a_refused_call_falls_back_and_says_why(server, caplog):
    """A refused call was told "scorer unreachable (StatusCode.INVALID_ARGUMENT)": now the server's
    reason is in the log."""
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, token="s3cret", retry_after_s=0.0)
    with caplog.at_level("WARNING", logger="gambit.serving.scorer_client"):  # an id over 128 bytes: refused
        assert client.score(["w:" + "1" * 200], torch.randn(1, H)).tolist() == [0.5]
    assert client.fallbacks == 1 and client.last_error.startswith("INVALID_ARGUMENT: ")
    assert "scorer call failed (INVALID_ARGUMENT: " in caplog.text and client.unguided == ""
    client.close()


def test_a_scorer_of_another_width_is_named_once_as_an_error_and_the_runs_unguided(server, caplog):
    """A Target whose model is wider than the Scorer reads (a scorer serve without --model, a chart with
    the wrong hiddenSize) got every call refused: each run ended "done" on 0.5 scores, with a WARNING
    per back-off only. Info is asked first now: one ERROR naming both widths and the address."""
    client = RemoteScorer(f"127.0.0.1:{server.port}", 2 * H, token="s3cret", retry_after_s=0.0)
    before = server.core.calls
    try:
        with caplog.at_level("WARNING", logger="gambit.serving.scorer_client"):
            for _ in range(3):
                assert client.score(["w:1"], torch.randn(1, 2 * H)).tolist() == [0.5]
        assert client.fallbacks == 3 and server.core.calls == before  # Info refused it: no Score call
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and errors[0] == client.unguided == client.last_error
        why = client.unguided
        assert why.startswith("runs unguided: ") and f"127.0.0.1:{server.port}" in why
        assert f"width {H} with 0" in why and f"width {2 * H} (its model's hidden size) with 0" in why
    finally:
        client.close()
    ok = RemoteScorer(f"127.0.0.1:{server.port}", H, token="s3cret")
    try:
        assert ok.score(["w:2"], torch.randn(1, H)).item() != 0.5 and ok.unguided == "" and ok._info_ok
    finally:
        ok.close()


def test_a_scorer_that_reads_other_features_leaves_the_runs_unguided(caplog):
    """A Target sending the confidence features (--scorer process) to a Scorer that reads none
    (scorer serve --scorer mlp): every call was refused as "features: ... reads none"."""
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env=""),
                              scorer=random_scorer("mlp", H, seed=1))
    client = RemoteScorer(f"127.0.0.1:{srv.port}", H, confidence=True, retry_after_s=0.0)
    try:
        with caplog.at_level("ERROR", logger="gambit.serving.scorer_client"):
            assert client.score(["f:1"], torch.randn(1, H + 2)).tolist() == [0.5]
        assert client.fallbacks == 1 and srv.core.calls == 0
        assert f"width {H} with 0 confidence features per row" in client.unguided
        assert f"sends width {H} (its model's hidden size) with 2" in client.unguided
        assert client.unguided in caplog.text
    finally:
        client.close()
        srv.stop()


def test_async_calls_keep_order_and_coalesce(server):
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, token="s3cret")
    ref = random_scorer("sequence", H, seed=3)
    xs = [torch.randn(2, H) for _ in range(12)]
    keys = [["q:1", "q:2"] if i % 2 else ["q:2", "q:3"] for i in range(12)]
    futs = [client.score_async(k, x) for k, x in zip(keys, xs, strict=True)]
    got = [f.result(30) for f in futs]
    for k, x, g in zip(keys, xs, got, strict=True):  # the server saw each key's rows in order
        assert torch.allclose(g, ref.score(k, x), atol=1e-6)
    assert client.calls < 12 and client.fallbacks == 0
    for k in ("q:1", "q:2", "q:3"):
        client.drop(k)
    client.score(["q:1"], torch.randn(1, H))  # carries the drops
    client.close()


def test_async_calls_leave_torch_work_to_the_callers_thread(server, monkeypatch):
    """The states are encoded on the caller's (the engine's) thread and the sender thread only joins
    bytes: a torch op there above ATen's grain size (a cat of a few hundred boundary rows) gave the
    Target a second OpenMP pool, after which every parallel region of every engine step slept and
    woke its worker (2x the step wall at 16 runs; ``gambit.engine.torch_threads``)."""
    from gambit.serving import scorer_client

    seen: list[str] = []
    real_cat, real_encode = torch.cat, scorer_client.encode_states

    def cat(*a, **k):
        seen.append(threading.current_thread().name)
        return real_cat(*a, **k)

    def encode(states):
        seen.append(threading.current_thread().name)
        return real_encode(states)

    monkeypatch.setattr(torch, "cat", cat)
    monkeypatch.setattr(scorer_client, "encode_states", encode)
    client = RemoteScorer(f"127.0.0.1:{server.port}", H, token="s3cret")
    ref = random_scorer("sequence", H, seed=3)
    xs = [torch.randn(3, H) for _ in range(8)]
    keys = [[f"t:{i}", f"u:{i}", f"v:{i}"] for i in range(8)]
    futs = [client.score_async(k, x) for k, x in zip(keys, xs, strict=True)]
    for k, x, f in zip(keys, xs, futs, strict=True):
        assert torch.allclose(f.result(30), ref.score(k, x), atol=1e-6)
    assert client.fallbacks == 0 and seen and "scorer-client" not in seen, seen
    bad = client.score_async(["a"], torch.randn(2, H))  # a shape error reaches the future, as before
    with pytest.raises(ValueError, match="states must be"):
        bad.result(5)
    for k in (k for ks in keys for k in ks):
        client.drop(k)
    client.score(["t:0"], torch.randn(1, H))  # carries the drops
    client.close()


def test_direct_endpoint_is_used_while_it_answers_then_the_proxy_takes_over():
    def start():
        return start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0),
                                   scorer=random_scorer("mlp", H, seed=1))

    direct, proxy = start(), start()
    asked = []

    def resolve():
        asked.append(1)
        return f"127.0.0.1:{direct.port}"

    client = RemoteScorer(f"127.0.0.1:{proxy.port}", H, resolve=resolve, retry_after_s=0.0)
    try:
        deadline = threading.Event()
        while not client.direct and not deadline.wait(0.01):  # looked up in the background
            pass
        x = torch.randn(3, H)
        want = random_scorer("mlp", H, seed=1).score([0, 1, 2], x)
        assert torch.allclose(client.score(["a", "b", "c"], x), want, atol=1e-6)
        assert client.direct_calls == 1 and direct.core.calls == 1 and proxy.core.calls == 0
        direct.stop()  # the replica goes away: the same call goes through the proxy, no fallback
        assert torch.allclose(client.score(["a", "b", "c"], x), want, atol=1e-6)
        assert proxy.core.calls == 1 and client.fallbacks == 0 and len(asked) >= 1
    finally:
        client.close()
        proxy.stop()


def test_closing_the_core_ends_its_batcher_thread():
    """The batcher is joined on close: left running as a daemon it could drop the core's last reference
    (and its scorer's tensors) while the interpreter exits, which aborted `gambit scorer serve` on about
    half of its SIGINT / SIGTERM stops (tests/serving/test_commands.py)."""
    core = ScorerCore(random_scorer("mlp", H, seed=1))
    assert core._thread.is_alive()
    core.close()
    assert not core._thread.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):
        core.submit(None)


def test_a_second_server_on_a_taken_port_is_refused(server):
    """gRPC binds with SO_REUSEPORT by default: a second `gambit scorer serve` on the same port started
    silently and the kernel split the connections between the two servers."""
    import threading

    before = {t.name for t in threading.enumerate()}
    cfg = ScorerServerConfig(host="127.0.0.1", port=server.port, metrics_port=-1, token_env="")
    with pytest.raises(OSError, match=f"127.0.0.1:{server.port}: cannot listen there"):
        start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=1))
    assert {t.name for t in threading.enumerate()} <= before  # the refused server's batcher is gone


def test_a_hung_scorer_is_backed_off_from_not_waited_on_every_round():
    """A Scorer that hangs (accepts, never answers) cost each try the timeout on the direct endpoint and
    again on the proxy, every ``retry_after_s``: runs went 3.3x slower. The direct endpoint is skipped
    while down too now, and the back-off doubles per failure in a row (reset by an answer)."""
    import socket

    from gambit.serving import scorer_client

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # the kernel accepts connections; nobody ever speaks gRPC on them
    addr = f"127.0.0.1:{hung.getsockname()[1]}"
    client = RemoteScorer(addr, H, timeout_s=0.1, retry_after_s=0.1, resolve=lambda: addr)
    try:
        t0, x = time.monotonic(), torch.randn(1, H)
        while time.monotonic() - t0 < 2.5:  # rounds back to back, as a Target's guidance loop makes them
            assert client.score(["a"], x).tolist() == [0.5]
            time.sleep(0.01)
        wall = time.monotonic() - t0
        # tries at ~0, 0.3, 0.7, 1.3, 2.3 s (down 0.1, 0.2, 0.4, 0.8 s after each): at a fixed 0.1 s each
        # try waited out both timeouts, about two thirds of the wall
        assert client.sync_seconds < 0.45 * wall, (client.sync_seconds, wall)
        assert client._failures >= 3 and client.fallbacks == client.calls
        assert scorer_client.MAX_RETRY_AFTER_S == 30.0
    finally:
        client.close()
        hung.close()


def test_a_full_call_over_the_endpoints_message_cap_is_refused_at_start():
    """`gambit scorer serve --max-rows` took any number: a full call over the 256 MiB its endpoint takes
    was refused RESOURCE_EXHAUSTED, every time, after a clean start. No proxy on the way: the Ray proxy's
    caps (128 MiB) are not this server's, and raising them is no advice here."""
    before = {t.name for t in threading.enumerate()}
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", max_rows=1147523)
    message = ("max_rows: 1147523 rows of width 16 make a Score call of up to 256 MiB, over the 256 MiB gRPC "
               "message cap; lower max_rows to 1147522 or less")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=1))
    assert {t.name for t in threading.enumerate()} <= before  # refused before its batcher started
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="", max_rows=1147522),
                              scorer=random_scorer("mlp", H, seed=1))
    srv.stop(0)


def test_the_endpoint_and_the_client_take_serve_envs_message_cap(monkeypatch):
    """The 256 MiB the server receives and the client sends was written out in each: one constant now."""
    from gambit.serving import scorer_endpoints, scorer_server

    monkeypatch.setattr(scorer_server, "SCORER_ENDPOINT_MESSAGE_BYTES", 1 << 16)
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env=""),
                              scorer=random_scorer("mlp", H, seed=1))
    try:
        with pytest.raises(grpc.RpcError) as e:  # 4096 x 16 x 4 bytes of states: 256 KiB > 64 KiB
            stub(srv).Score(request(torch.randn(4096, H), [f"t:{i}" for i in range(4096)]))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        monkeypatch.setattr(scorer_endpoints, "SCORER_ENDPOINT_MESSAGE_BYTES", 1 << 16)  # the client's
        client = RemoteScorer(f"127.0.0.1:{srv.port}", H)
        try:
            client.score([f"t:{i}" for i in range(4096)], torch.randn(4096, H))
            assert client.fallbacks == 1 and "RESOURCE_EXHAUSTED" in client.last_error
            assert "Sent message larger than max" in client.last_error  # refused here, before it left
        finally:
            client.close()
    finally:
        srv.stop(0)
