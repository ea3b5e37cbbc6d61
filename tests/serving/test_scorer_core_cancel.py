"""A Score call whose caller gave up (a Ray request cancelled when its Target's deadline passed) never
takes the batcher down: the calls after it are answered."""

import asyncio
import threading

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.payload import encode_states
from gambit.serving.scorer_core import ScorerCore

H = 8
X = torch.randn(3, H, generator=torch.Generator().manual_seed(0))


class Held:
    """A scorer whose first ``score`` waits until released (a slow batch)."""

    def __init__(self) -> None:
        self.inner = random_scorer("mlp", H, seed=1)
        self.kind, self.hidden_size, self.input_size = "mlp", H, H
        self.started, self.release = threading.Event(), threading.Event()

    def score(self, keys, states):
        self.started.set()
        assert self.release.wait(10)
        return self.inner.score(keys, states)

    def fork(self, parent, child):
        pass

    def drop(self, key):
        pass


def job(core, row, key):
    return core.validate(*encode_states(X[row:row + 1]), [key])


@pytest.mark.parametrize("cancelled", ["scoring", "queued"])
def test_a_cancelled_call_leaves_the_batcher_answering(cancelled):
    """Its future cancelled under the batcher, set_result raised InvalidStateError: the batcher thread
    died, and every later call waited out its timeout (the Ray deployment's for good)."""
    scorer = Held()
    core = ScorerCore(scorer, batch_wait_s=0.0)
    try:
        first = core.submit(job(core, 0, "a"))
        assert scorer.started.wait(5)
        queued = core.submit(job(core, 1, "b"))
        (first if cancelled == "scoring" else queued).cancel()
        scorer.release.set()
        if cancelled == "queued":
            assert queued.cancelled() and first.result(5).shape == (1,)
        assert core.score(job(core, 2, "c"), timeout=5).item() == pytest.approx(
            scorer.inner.score(["c"], X[2:3]).item(), abs=1e-6)
    finally:
        scorer.release.set()
        core.close()


def test_an_async_call_cancelled_by_its_caller_leaves_the_batcher_answering():
    scorer = Held()
    core = ScorerCore(scorer, batch_wait_s=0.0)

    async def main():
        task = asyncio.create_task(core.score_async(job(core, 0, "a")))
        while not scorer.started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()  # the proxy cancels the replica's request when the client's deadline passes
        with pytest.raises(asyncio.CancelledError):
            await task
        scorer.release.set()
        return await core.score_async(job(core, 1, "b"), timeout=5)

    try:
        assert asyncio.run(main()).shape == (1,)
    finally:
        scorer.release.set()
        core.close()


def test_an_async_call_times_out_saying_so():
    scorer = Held()
    core = ScorerCore(scorer, batch_wait_s=0.0)
    try:
        with pytest.raises(TimeoutError, match="timed out after 0.2 s waiting for the scorer"):
            asyncio.run(core.score_async(job(core, 0, "a"), timeout=0.2))
    finally:
        scorer.release.set()
        core.close()
