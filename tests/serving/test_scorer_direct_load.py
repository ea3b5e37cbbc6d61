"""The load a Scorer's direct endpoint reports for autoscaling: Score calls in flight, counted while
they wait on a (held) scorer, and their time-weighted mean (``OngoingCalls``)."""

import threading
import time

import grpc
import torch
from serving_util import until

from gambit.scoring import random_scorer
from gambit.serving.ongoing import OngoingCalls
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_core import ScorerCore
from gambit.serving.scorer_server import scorer_grpc_server

H = 8
pb2, pb2_grpc = load("scorer")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_mean_is_time_weighted_and_windows_reset():
    clock = Clock()
    calls = OngoingCalls(clock)
    a = calls.__enter__()
    clock.t = 1.0
    calls.__enter__()  # 1 call for 1 s, then 2 for 1 s
    clock.t = 2.0
    assert calls.now == 2 and calls.mean() == 1.5
    clock.t = 3.0
    a.__exit__(None, None, None)  # 2 for 1 s then 1 for 3 s: (2 + 3) / 4
    clock.t = 6.0
    calls.__exit__(None, None, None)
    assert calls.mean() == 5 / 4
    assert calls.mean() == 0.0  # no time passed, none in flight
    clock.t = 7.0
    assert calls.mean() == 0.0 and calls.now == 0


def held_scorer(release: threading.Event):
    scorer = random_scorer("mlp", H, seed=0)
    score = scorer.score

    def held(keys, states):
        release.wait(10)
        return score(keys, states)

    scorer.score = held
    return scorer


def score_request(key: str):
    raw, dtype, shape = encode_states(torch.zeros(1, H))
    return pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=[key])




def test_direct_endpoint_counts_its_calls_in_flight():
    release = threading.Event()
    core = ScorerCore(held_scorer(release), max_rows=16, batch_wait_s=0.0)
    ongoing = OngoingCalls()
    server, port = scorer_grpc_server(core, _Metrics(), "127.0.0.1:0", workers=16, ongoing=ongoing)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = pb2_grpc.ScorerServiceStub(channel)
        stub.Info(pb2.InfoRequest(), timeout=5)
        assert ongoing.mean() == 0.0  # Info is no Score call
        futures = [stub.Score.future(score_request(f"t:{i}"), timeout=10) for i in range(12)]
        assert until(lambda: ongoing.now == 12), ongoing.now  # 12 > gRPC's 8 default workers
        time.sleep(0.05)
        assert 0 < ongoing.mean() <= 12
        release.set()
        assert all(len(f.result().scores) == 1 for f in futures)
        assert until(lambda: ongoing.now == 0)
    finally:
        release.set()
        channel.close()
        server.stop(0)
        core.close()


class _Metrics:
    def inc(self, *a, **k) -> None:
        pass

    def observe(self, *a, **k) -> None:
        pass
