"""The Scorer's autoscaling sees its direct endpoint's calls: each replica reports them
(``record_autoscaling_stats``) and the deployment's policy adds them to Serve's own count. Without
them, a Scorer busy with its Targets' direct calls read ~0 ongoing requests and never scaled up."""

import ast
import inspect
import threading
import time
from types import SimpleNamespace

import grpc
import pytest
import torch
from ray.serve.autoscaling_policy import _apply_autoscaling_config, default_autoscaling_policy
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from gambit.deployments import scorer_autoscaling
from gambit.deployments.scorer_autoscaling import DIRECT_ONGOING, POLICY, scorer_autoscaling_policy
from gambit.serving.payload import encode_states
from gambit.serving.protos import load

H = 8
pb2, pb2_grpc = load("scorer")


def context(total: float, direct: dict, replicas: int = 1, **config) -> AutoscalingContext:
    cfg = AutoscalingConfig(**({"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8,
                                "upscale_delay_s": 0} | config))
    return AutoscalingContext(
        deployment_id=None, deployment_name="Scorer", app_name="scorer", current_num_replicas=replicas,
        target_num_replicas=replicas, running_replicas=list(direct), total_num_requests=total,
        total_queued_requests=0.0, aggregated_metrics={DIRECT_ONGOING: direct} if direct else {},
        raw_metrics={}, capacity_adjusted_min_replicas=cfg.min_replicas,
        capacity_adjusted_max_replicas=cfg.max_replicas, policy_state={}, last_scale_up_time=None,
        last_scale_down_time=None, current_time=time.time(), config=cfg)


def test_policy_adds_the_direct_calls_to_serves_count():
    ctx = context(total=1.0, direct={"r1": 14.0, "r2": 10.0}, replicas=2)
    assert scorer_autoscaling_policy(ctx)[0] == pytest.approx(25 / 8)
    assert default_autoscaling_policy(ctx)[0] == pytest.approx(1 / 8)  # Serve's own: scale down
    # as Serve runs it (factors, delays): 2 replicas become 4 under the direct load
    assert _apply_autoscaling_config(scorer_autoscaling_policy)(ctx)[0] == 4
    assert _apply_autoscaling_config(scorer_autoscaling_policy)(context(2.0, {}, 1))[0] == 1  # no report


def test_scorer_deployment_uses_the_policy_and_the_module_imports_no_gambit():
    from gambit.deployments.scorer import Scorer

    auto = Scorer._deployment_config.autoscaling_config  # noqa: SLF001
    assert auto.policy.policy_function == POLICY and auto.policy.get_policy()(
        SimpleNamespace(current_num_replicas=1, total_num_requests=0.0, config=auto,
                        aggregated_metrics={DIRECT_ONGOING: {"r": 16.0}}))[0] == 2
    # pickled by value into Serve's controller, which may lack gambit
    tree = ast.parse(inspect.getsource(scorer_autoscaling))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n and n.startswith("gambit")]


def test_replica_reports_its_direct_calls_in_flight():
    """12 Score calls held on a replica's direct endpoint (more than gRPC's 8 default handler
    threads) are all counted, and ``record_autoscaling_stats`` reports them to Serve."""
    from gambit.deployments.scorer import Scorer

    d = Scorer.func_or_class(scorer=f"random:mlp:{H}", direct_host="127.0.0.1")
    release, score = threading.Event(), d.core.scorer.score
    d.core.scorer.score = lambda keys, states: (release.wait(10), score(keys, states))[1]
    channel = grpc.insecure_channel(d._address)  # noqa: SLF001 — address() asks Ray for the node
    try:
        assert d.record_autoscaling_stats() == {DIRECT_ONGOING: 0.0}
        stub = pb2_grpc.ScorerServiceStub(channel)
        raw, dtype, shape = encode_states(torch.zeros(1, H))
        futures = [stub.Score.future(pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape,
                                                      trace_ids=[f"t:{i}"]), timeout=10) for i in range(12)]
        deadline = time.monotonic() + 5
        while d.direct_ongoing.now < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.direct_ongoing.now == 12
        time.sleep(0.05)
        stats = d.record_autoscaling_stats()
        assert set(stats) == {DIRECT_ONGOING} and 0 < stats[DIRECT_ONGOING] <= 12
        time.sleep(0.05)
        assert d.record_autoscaling_stats()[DIRECT_ONGOING] == pytest.approx(12)  # all held that window
        release.set()
        assert all(len(f.result().scores) == 1 for f in futures)
    finally:
        release.set()
        channel.close()
        d.direct.stop(0)
        d.core.close()
