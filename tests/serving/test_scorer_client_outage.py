"""RemoteScorer through a long Scorer outage: every call is answered by the stated fallback and
counted, however many calls in a row failed before."""

import time

import pytest
import torch

from gambit.serving import scorer_client
from gambit.serving.scorer_client import RemoteScorer

H = 8


class Counter:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def inc(self, name: str, value: int = 1, **labels) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def observe(self, name: str, value: float, **labels) -> None:
        pass


def test_a_scorer_down_for_hours_still_gets_the_fallback_not_an_overflow():
    """The back-off was ``retry_after_s * 2 ** failures``: at the 1025th failure in a row (~8 h into an
    outage at 30 s a try) the int was too large for a float, and score() raised OverflowError into
    every run of the Target instead of falling back."""
    metrics = Counter()
    client = RemoteScorer("127.0.0.1:1", H, timeout_s=0.2, retry_after_s=1.0, metrics=metrics)
    try:
        client._failures = 1100  # as after 1100 failed tries
        got = client.score(["t:a", "t:b"], torch.zeros(2, H))
        assert got.tolist() == [0.5, 0.5] and client.fallbacks == 1
        assert metrics.counts == {"gambit_scorer_fallback_total": 1}
        left = client._down_until - time.monotonic()
        assert scorer_client.MAX_RETRY_AFTER_S - 1 < left <= scorer_client.MAX_RETRY_AFTER_S
        client._down_until = 0.0
        assert client.score(["t:a"], torch.zeros(1, H)).tolist() == [0.5] and client.fallbacks == 2
    finally:
        client.close()


@pytest.mark.parametrize("failures", [0, 1, 2])
def test_the_back_off_still_doubles_from_retry_after_s(failures):
    client = RemoteScorer("127.0.0.1:1", H, timeout_s=0.2, retry_after_s=0.5)
    try:
        client._failures = failures
        client.score(["t:a"], torch.zeros(1, H))
        assert client._down_until - time.monotonic() == pytest.approx(0.5 * 2 ** failures, abs=0.2)
    finally:
        client.close()


def test_a_call_after_close_is_refused_not_left_waiting():
    """Queued behind a sender thread that had ended, its future was never answered: the engine thread
    waiting on it hung."""
    client = RemoteScorer("127.0.0.1:1", H, timeout_s=0.2, retry_after_s=0.0)
    client.score_async(["t:a"], torch.zeros(1, H)).result(5)  # starts the sender: a fallback
    client.close()
    fut = client.score_async(["t:b"], torch.zeros(1, H))
    with pytest.raises(RuntimeError, match="scorer client is closed"):
        fut.result(2)
