"""Operations against the live local deployment (the session's Ray Serve, conftest):

* a real Prometheus (Debian package, from `make ops-tools`) on 127.0.0.1 scrapes Ray's metrics port
  while the deployment serves runs; every dashboard panel query and every alert's queries must return
  at least one series (a panel that would show "No data" fails);
* a short bounded Locust run (loadtest/locustfile.py) has zero failures and leaves no KV blocks behind.
"""

from __future__ import annotations

import os
import threading
import time

import grpc
import pytest

from gambit.engine.sequence import SamplingParams
from gambit.ops.dashboards import panel_queries
from gambit.ops.prometheus import PrometheusServer, empty_queries
from gambit.serving.protos import load
from gambit.tasks.arithmetic import TaskConfig, generate

pytestmark = pytest.mark.slow
pb2, pb2_grpc = load("reasoning")
PROBLEMS = [p.prompt for p in generate("test", 8, 3, TaskConfig(2, 5))]
SPECULATIVE = "decoding" in SamplingParams.__dataclass_fields__  # speculative decoding wired into the engine
TAU_PANEL = "Acceptance length (tokens per target forward)"


def _md():
    return (("authorization", f"Bearer {os.environ['GAMBIT_TEST_SERVE_TOKEN']}"), ("application", "gambit"))


def _solve(stub, **kw):
    return list(stub.Solve(pb2.SolveRequest(**kw), metadata=_md(), timeout=240))


def _workload(stack) -> list[str]:
    """Runs of every method at once, a bad request, a cancelled run, then a Scorer outage."""
    from ray import serve

    from gambit.deployments.app import build_scorer

    stub = pb2_grpc.ReasoningServiceStub(grpc.insecure_channel(stack["address"]))
    statuses: list[str] = []
    decodings = ["plain", "pr", "plain", "eagle3.1"] if SPECULATIVE else ["plain"] * 4

    def run(i, method):
        # Gambit's seed 109: a run that makes swaps that gain (4; seed 100's traces tie and make none);
        # the panel shows 0 without any, so the test reads the counters themselves as well
        ev = _solve(stub, problem=PROBLEMS[i], method=method, decoding=decodings[i], capacity=4, swap=1,
                    round_interval=8, max_tokens=96, seed=109 if method == "gambit" else 100 + i)
        statuses.append(ev[-1].result.status)

    threads = [threading.Thread(target=run, args=(i, m)) for i, m in enumerate(("gambit", "sc", "step",
                                                                                 "deepconf"))]
    for t in threads:
        t.start()
    with pytest.raises(grpc.RpcError) as e:  # an error, counted by code
        _solve(stub, problem="", max_tokens=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    call = stub.Solve(pb2.SolveRequest(problem=PROBLEMS[5], capacity=4, max_tokens=300, seed=7),
                      metadata=_md(), timeout=240)
    run_id = next(iter(call)).started.run_id
    assert stub.CancelRun(pb2.CancelRunRequest(run_id=run_id), metadata=_md()).cancelled
    statuses.append(list(call)[-1].result.status)
    for t in threads:
        t.join(240)
    cfg = stack["cfg"]
    serve.delete("scorer")  # the Scorer goes away: rounds fall back to unscored ranking
    try:
        res = _solve(stub, problem=PROBLEMS[6], capacity=4, max_tokens=64, seed=9)[-1].result
        assert res.scorer_fallbacks > 0
        statuses.append(res.status)
    finally:
        serve.run(build_scorer({"scorer": cfg.scorer, "token_env": cfg.token_env}), name="scorer",
                  route_prefix="/scorer", blocking=False)
    return statuses


def test_every_dashboard_query_and_alert_returns_series(serve_stack):
    with PrometheusServer([f"127.0.0.1:{serve_stack['cfg'].metrics_port}"]) as prom:
        statuses = _workload(serve_stack)
        assert sorted(statuses) == ["cancelled"] + ["done"] * 5
        prom.wait_scraped(samples=2, timeout_s=60)
        expected = {} if SPECULATIVE else {TAU_PANEL: panel_queries("ray_", "5m")[TAU_PANEL]}
        # the panels show 0 for a counter never exported; this workload makes each of these (the Scorer
        # outage the fallbacks), so each must be exported with a positive value as well
        counters = [f"sum(ray_gambit_{n}_total) > 0" for n in ("prunes", "branches", "scorer_fallback")]
        # the bad Solve counted as a Solve error (the error alert reads rpc="Solve" only), and each
        # decoding's drafts as their own series (the tau panel shows one line per decoding)
        counters.append('sum(ray_gambit_request_errors_total{rpc="Solve",code="INVALID_ARGUMENT"}) > 0')
        counters += [f'sum(ray_gambit_spec_decode_num_drafts_total{{decoding="{d}"}}) > 0'
                     for d in (("pr", "eagle3.1") if SPECULATIVE else ())]
        deadline = time.monotonic() + 90  # Ray exports every ~10 s; Prometheus scrapes every second
        while ((missing := empty_queries(prom, "ray_", rate_interval="5m")) != expected
               or (unset := [c for c in counters if not prom.query(c)])) and time.monotonic() < deadline:
            time.sleep(1)  # Ray's next export is seen within a second of its scrape
        assert missing == expected, f"queries without data: {missing}"
        assert not unset, f"counters not exported: {unset}"
        # and the metrics carry no run ids
        labels = {k for s in prom.query('{__name__=~"ray_gambit_.*"}') for k in s["metric"]}
        assert not {k for k in labels if "run" in k.lower()}, labels


def test_short_locust_run_has_no_failures_and_leaks_no_kv(serve_stack, tmp_path):
    from gambit.ops.loadtest import LoadTestConfig, read_summary, run_locust, target_load_when_idle

    cfg = LoadTestConfig(users=3, spawn_rate=3, run_time_s=15, stop_timeout_s=120, cancel_fraction=0.25,
                         max_tokens_scale=0.5, token_env="GAMBIT_TEST_SERVE_TOKEN",
                         csv_prefix=str(tmp_path / "lt"), summary_csv=str(tmp_path / "summary.csv"))
    r = run_locust(cfg, serve_stack["address"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows, note = read_summary(cfg.summary_csv)
    by = {row["entry"]: row for row in rows}
    assert int(by["Solve first event"]["requests"]) >= 3 and int(by["Solve end to end"]["requests"]) >= 1
    assert all(int(row["failures"]) == 0 for row in rows), rows
    assert "failures=0" in note
    # the answers it got right under load, counted against each problem's gold (none counted before)
    finished, correct = (int(note.split(f"{k}=")[1].split()[0]) for k in ("finished", "correct"))
    assert 1 <= finished <= int(by["Solve end to end"]["requests"]) and 0 < correct <= finished, note
    load = target_load_when_idle(timeout_s=60)
    assert (load["runs"], load["reserved_blocks"], load["kv_usage"]) == (0, 0, 0.0), load
