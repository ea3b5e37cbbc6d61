"""The standalone Scorer keeps its callers' deadlines, and a closed client says so on every path."""

import threading

import grpc
import pytest
import torch
from serving_util import until

from gambit.scoring import random_scorer
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

H = 8
X = torch.randn(3, H, generator=torch.Generator().manual_seed(0))
pb2, pb2_grpc = load("scorer")


class Held:
    """A scorer whose first ``score`` waits until released (a slow batch); it notes every key scored."""

    def __init__(self) -> None:
        self.inner = random_scorer("mlp", H, seed=1)
        self.kind, self.hidden_size, self.input_size = "mlp", H, H
        self.started, self.release = threading.Event(), threading.Event()
        self.scored: list[str] = []

    def score(self, keys, states):
        self.started.set()
        assert self.release.wait(10)
        self.scored += keys
        return self.inner.score(keys, states)

    def fork(self, parent, child):
        self.scored.append(f"fork {parent} {child}")

    def drop(self, key):
        pass


def test_a_call_whose_deadline_passed_in_the_queue_is_not_scored():
    """It waited out the core's 30 s (a Target gives up after 2 s), holding a handler thread, and was then
    scored and its forks applied for nobody: the Target had fallen back and queued them again."""
    held = Held()
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="", batch_wait_ms=0),
                              scorer=held)
    stub = pb2_grpc.ScorerServiceStub(grpc.insecure_channel(f"127.0.0.1:{srv.port}"))
    first = []
    try:
        raw, dtype, shape = encode_states(X[0:1])
        t = threading.Thread(target=lambda: first.append(stub.Score(pb2.ScoreRequest(
            states=raw, dtype=dtype, shape=shape, trace_ids=["a"]), timeout=10)))
        t.start()
        assert held.started.wait(5)  # the batcher is busy with "a"
        raw, dtype, shape = encode_states(X[1:2])
        with pytest.raises(grpc.RpcError) as e:  # queued behind it; its caller gives up after 0.3 s
            stub.Score(pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=["b"],
                                        forks=[pb2.Fork(parent="a", child="c")]), timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        held.release.set()
        t.join(10)
        assert len(first) == 1 and until(lambda: not srv.core._queue)
        b = stub.Score(pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=["b2"]), timeout=10)
        assert len(b.scores) == 1 and held.scored == ["a", "b2"]  # not "b", nor its fork
    finally:
        held.release.set()
        srv.stop(0)


def test_a_closed_client_refuses_a_call_as_its_async_path_does():
    """``score`` after ``close`` fell back with "Cannot invoke RPC on closed channel!", counted as a
    Scorer outage, and a call asking Info again opened a channel nobody closed."""
    client = RemoteScorer("127.0.0.1:1", H)
    client.close()
    with pytest.raises(RuntimeError, match="scorer client is closed"):
        client.score(["a"], X[0:1])
    with pytest.raises(RuntimeError, match="scorer client is closed"):
        client.score_async(["a"], X[0:1]).result(5)
    assert client.fallbacks == 0 and not client._channels
