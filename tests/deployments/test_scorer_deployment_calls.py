"""The Ray ``Scorer``'s Score through the proxy path (the class built directly, no Serve): a scorer
error is INTERNAL and counted as the direct endpoint counts it, and a cancelled request (its Target's
deadline passed) leaves the replica answering."""

import asyncio
import threading

import grpc
import pytest

from gambit.serving.payload import encode_states
from gambit.serving.protos import load

pb2, _ = load("scorer")
H = 8


class Context:
    def __init__(self) -> None:
        self.code = self.details = None

    def invocation_metadata(self):
        return ()

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


class Counter:
    def __init__(self) -> None:
        self.counts: dict[tuple, int] = {}

    def inc(self, name: str, value: int = 1, **labels) -> None:
        key = (name, *sorted(labels.items()))
        self.counts[key] = self.counts.get(key, 0) + value

    def observe(self, name: str, value: float, **labels) -> None:
        pass


def request(key: str = "t:a"):
    import torch

    raw, dtype, shape = encode_states(torch.zeros(1, H))
    return pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=[key])


@pytest.fixture
def dep():
    from gambit.deployments.scorer import Scorer

    d = Scorer.func_or_class(scorer=f"random:mlp:{H}", direct_host="")
    d.metrics = d.core.metrics = Counter()
    yield d
    d.core.close()


def test_a_scorer_error_is_internal_and_counted(dep):
    """It went out as Ray's own INTERNAL, uncounted in gambit_request_errors_total."""
    class Broken:
        kind, hidden_size, input_size = "mlp", H, H

        def score(self, keys, states):
            raise RuntimeError("out of memory")

    dep.core.scorer = Broken()
    ctx = Context()
    with pytest.raises(RuntimeError, match="scoring failed: out of memory"):
        asyncio.run(dep.Score(request(), ctx))
    assert ctx.code == grpc.StatusCode.INTERNAL and ctx.details == "scoring failed: out of memory"
    assert dep.metrics.counts == {("gambit_request_errors_total", ("code", "INTERNAL"), ("rpc", "Score")): 1}


def test_a_cancelled_request_leaves_the_replica_answering(dep):
    """Cancelled while its batch was scored, its future's set_result raised in the batcher thread: the
    replica answered no Score call again."""
    inner = dep.core.scorer
    started, release = threading.Event(), threading.Event()

    class Slow:
        kind, hidden_size, input_size = "mlp", H, H

        def score(self, keys, states):
            started.set()
            assert release.wait(10)
            return inner.score(keys, states)

    dep.core.scorer = Slow()

    async def main():
        task = asyncio.create_task(dep.Score(request("t:a"), Context()))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        return await asyncio.wait_for(dep.Score(request("t:b"), Context()), 5)

    try:
        assert len(asyncio.run(main()).scores) == 1
    finally:
        release.set()
