"""Ray Serve end to end over gRPC (generated client): Coordinator → Target → Scorer, Redis, metrics,
faults and bad input. One Ray start per session (conftest)."""

from __future__ import annotations

import functools
import os
import re
import signal
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gambit.serving.protos import load
from gambit.tasks.arithmetic import TaskConfig, generate

pytestmark = pytest.mark.slow
pb2, pb2_grpc = load("reasoning")
PROBLEMS = [p.prompt for p in generate("test", 4, 0, TaskConfig(2, 4))]
LONG = generate("test", 1, 0, TaskConfig(7, 8))[0].prompt  # longer traces: still in flight when cancelled


def md(token=True):
    token = os.environ["GAMBIT_TEST_SERVE_TOKEN"] if token else ""  # set by the session fixture
    return ((("authorization", f"Bearer {token}"),) if token else ()) + (("application", "gambit"),)


def stub(stack):
    return pb2_grpc.ReasoningServiceStub(grpc.insecure_channel(stack["address"]))


def solve(stack, timeout=120, token=True, **kw):
    kw.setdefault("problem", PROBLEMS[0])
    return list(stub(stack).Solve(pb2.SolveRequest(**kw), metadata=md(token), timeout=timeout))


def kv_blocks(problem: str, capacity: int, max_tokens: int) -> int:
    """A run's worst-case KV blocks on the stack's Target (``TargetService.blocks_needed``)."""
    from gambit.engine.block_manager import shared_prompt_blocks

    n = len(_tokenizer().encode(problem))
    return shared_prompt_blocks(n, n + max_tokens, capacity, 16)


@functools.cache
def _tokenizer():
    from gambit.model import load_model
    from gambit.paths import TARGET

    return load_model(str(TARGET))[1]


class Background:
    """A run in flight while a test does something else; ``join()`` returns its last event."""

    def __init__(self, stack, **kw) -> None:
        self.events, self.error = [], None
        kw.setdefault("problem", PROBLEMS[1])
        self.call = stub(stack).Solve(pb2.SolveRequest(**kw), metadata=md(), timeout=240)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for ev in self.call:
                self.events.append(ev)
        except grpc.RpcError as e:
            self.error = e

    def wait_started(self, timeout=120):
        deadline = time.monotonic() + timeout
        while not self.events and self.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.events and self.events[0].WhichOneof("event") == "started", self.error
        return self.events[0].started.run_id

    def join(self, timeout=240):
        self.thread.join(timeout)
        assert self.error is None, self.error
        return self.events[-1]


def target_load():
    from ray import serve

    return serve.get_deployment_handle("Target", app_name="gambit").load.remote().result(timeout_s=30)


def wait_for(pred, timeout=60, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    return pred()


def test_solve_streams_progress_then_result_and_records_redis_and_metrics(serve_stack):
    events = solve(serve_stack, seed=3, capacity=4, swap=1, round_interval=8)
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-1] == "result" and set(kinds[1:-1]) <= {"progress"}
    rounds = [e.progress for e in events if e.WhichOneof("event") == "progress"]
    assert [p.round for p in rounds] == list(range(1, len(rounds) + 1)) and rounds
    assert all(p.active + p.ghost <= 4 and 0 <= p.kv_usage <= 1 for p in rounds)
    assert [p.tokens for p in rounds] == sorted(p.tokens for p in rounds)
    res = events[-1].result
    run_id = events[0].started.run_id
    assert res.status == "done" and res.run_id == run_id and res.scorer_fallbacks == 0
    votes = {v.answer: v.weight for v in res.majority_votes}
    assert res.majority_answer == max(votes, key=votes.get) and res.answer in votes
    assert res.generated_tokens == sum(t.tokens for t in res.traces) > 0
    assert f"\\boxed{{{res.answer}}}" in res.solution  # the reasoning behind the answer
    assert {t.trace_id: t.answer for t in res.traces}[res.solution_trace] == res.answer
    # why each trace ended crosses the API too: a finished one by eos (or its limit), a pruned one pruned
    ends = {f: {t.end_reason for t in res.traces if t.finish_reason == f} for f in ("finished", "pruned")}
    assert ends["finished"] and ends["finished"] <= {"eos", "stop", "length"}, ends
    assert ends["pruned"] and ends["pruned"] <= {"pruned", "ghost"}, ends
    assert res.timings.total_s > 0 and 0 < res.timings.first_event_s <= res.timings.total_s + 1
    # GetRun and the raw tree view in Redis
    info = stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=run_id), metadata=md())
    assert info.status == "done" and info.result.answer == res.answer and info.request.problem == PROBLEMS[0]
    assert info.num_traces == len(res.traces)
    # the served default scorer (scorer-process) reads the target's confidence: the Target sent it with
    # every Score call (none fell back), and the ScorerService says so through the proxy
    spb2, sgrpc = load("scorer")
    sinfo = sgrpc.ScorerServiceStub(grpc.insecure_channel(serve_stack["address"])).Info(
        spb2.InfoRequest(), metadata=md()[:1] + (("application", "scorer"),))
    assert (sinfo.hidden_size, sinfo.features) == (192, 2)
    # the Target found the Scorer replica's own endpoint and scores there, not through the proxy
    assert wait_for(lambda: target_load()["scorer_direct"].startswith("127.0.0.1:"), timeout=30)
    r, prefix = serve_stack["redis"], serve_stack["prefix"]
    tree = r.hgetall(f"{prefix}tree:run:{run_id}:nodes")
    assert len(tree) == len(res.traces) and sum('"parent": null' in v for v in tree.values()) == 4
    # health and reflection on the proxy
    ch = grpc.insecure_channel(serve_stack["address"])
    assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(
        service="gambit.v1.ReasoningService")).status == health_pb2.HealthCheckResponse.SERVING
    # Ray's metrics export: the contract names with the ray_ prefix, no run ids as labels
    url = f"http://127.0.0.1:{serve_stack['cfg'].metrics_port}/metrics"

    names = ("ray_gambit_generation_tokens_total", "ray_gambit_traces_started_total",
             "ray_gambit_rounds_total", "ray_gambit_kv_cache_usage_perc",
             "ray_gambit_scorer_latency_seconds_count", "ray_gambit_time_to_first_token_seconds_bucket",
             "ray_gambit_num_requests_running", "ray_gambit_e2e_request_latency_seconds_count")

    def tokens(text):
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("ray_gambit_generation_tokens_total{"))

    def scrape():  # each replica's process exports on its own ~10 s clock
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        ok = all(n in text for n in names) and tokens(text) >= res.generated_tokens
        return text if ok else None

    text = wait_for(scrape, timeout=90, every=2)
    assert text, "gambit metrics never exported (or the token counter never caught up)"
    assert run_id not in text
    # no test has asked for an unknown run yet: the start's readiness probe counted none (it counted a
    # NOT_FOUND at every start; test_ops_live, on this stack before, makes INVALID_ARGUMENTs)
    errors = [re.findall(r'(?:code|deployment)="[^"]*"', ln) for ln in text.splitlines()
              if ln.startswith("ray_gambit_request_errors_total{")]
    assert not [e for e in errors if 'code="NOT_FOUND"' in e], errors


def test_client_get_and_cancel_print_the_run_record_and_stop_a_run(serve_stack, capsys):
    """`gambit client get RUN` / `gambit client cancel RUN` over the proxy; GetRun's result carries the
    time to the first event as the stream's result did (the Coordinator records it: it was 0)."""
    from gambit.cli import main

    events = solve(serve_stack, seed=11, capacity=4, swap=1, round_interval=8)
    run_id, streamed = events[0].started.run_id, events[-1].result
    assert streamed.timings.first_event_s > 0
    info = wait_for(lambda: (i := stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=run_id), metadata=md()))
                    .result.timings.first_event_s > 0 and i)
    assert info and info.result.timings.first_event_s == streamed.timings.first_event_s
    # the settings it ran with, the server's defaults filled in (a request that left max_tokens 0 could not
    # learn the 120 it got): in RunStarted and in GetRun
    for got in (events[0].started.settings, info.settings):
        assert (got.method, got.decoding, got.capacity, got.swap, got.round_interval, got.max_tokens,
                got.seed, got.answer_rule) == ("gambit", "plain", 4, 1, 8, 120, 11, "boxed")
        assert got.temperature == pytest.approx(0.8) and not got.problem
    assert info.request.max_tokens == 0  # the request as sent stays as it was
    # its id is taken: a second Solve with it is refused, and the record and tree stay this run's (one
    # started, its nodes joining this run's tree, its record replacing this one)
    with pytest.raises(grpc.RpcError) as e:
        solve(serve_stack, run_id=run_id, problem=PROBLEMS[1], capacity=2, swap=0)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS and "ended (done)" in e.value.details()
    again = stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=run_id), metadata=md())
    assert again.num_traces == info.num_traces and again.request.problem == PROBLEMS[0]
    # one refused before it started (more KV than the Target holds) holds nothing: a retry with its id runs
    with pytest.raises(grpc.RpcError) as e:
        solve(serve_stack, run_id="retry-1", capacity=5000)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert solve(serve_stack, run_id="retry-1", capacity=2, swap=0)[-1].result.status == "done"
    conn = ["--address", serve_stack["address"], "--token-env", "GAMBIT_TEST_SERVE_TOKEN"]
    capsys.readouterr()
    assert main(["client", "get", run_id, *conn]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"run {run_id}: done  replica ") and "seed 11" in out[0]
    assert f"traces {info.num_traces}  " in out[0]
    assert out[1] == f"problem: {' '.join(PROBLEMS[0].split())}"  # which run it is, at a glance
    assert out[2] == ("settings: gambit plain  C=4 K=1 Δ=8  max_tokens 120  temperature 0.8  seed 11  "
                      "answer_rule boxed")
    (result,) = [ln for ln in out if ln.startswith("result: ")]
    assert result.startswith(f"result: done  answer {streamed.answer or '-'}  ")
    assert f"first event {streamed.timings.first_event_s:.3f}s" in result
    if streamed.answer:  # then the reasoning behind it, indented
        assert f"solution (trace {streamed.solution_trace}):" in out
        assert "\n".join(out).endswith("\n".join("  " + s for s in streamed.solution.rstrip().splitlines()))
    assert main(["client", "get", "never-was", *conn]) == 1
    assert "error: NOT_FOUND: run_id: no run 'never-was'" in capsys.readouterr().err
    # the run must still be in flight for the two calls below; a warm Zen 5 host ends 16 traces of 400
    # tokens in ~0.1-0.5 s (it once ended first at T = 0.8 and Δ 4), a race no setting closes: T = 2 (none
    # boxes an answer early), a Score round every step, and a run that ended first is retried with another
    out = ""
    for attempt in range(5):
        bg = Background(serve_stack, max_tokens=400, seed=12 + attempt, capacity=16, problem=LONG,
                        round_interval=1, temperature=2.0)
        rid = bg.wait_started()
        with pytest.raises(grpc.RpcError) as e:  # an id in flight is taken too
            solve(serve_stack, run_id=rid)
        assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value
        if "in flight" in e.value.details():
            assert main(["client", "cancel", rid, *conn]) == 0
            out = capsys.readouterr().out.strip()
            if out != f"run {rid}: not in flight (status done)":
                break
        assert "ended (done)" in e.value.details() or "(status done)" in out  # the race lost, nothing else
        assert bg.join().result.status == "done"
    else:
        pytest.fail("5 runs of 16 × 400 tokens each ended before a CancelRun reached them")
    assert out == f"run {rid}: cancelled (status cancelling)"
    assert bg.join().result.status == "cancelled"
    assert main(["client", "cancel", rid, *conn]) == 0
    assert capsys.readouterr().out.strip() == f"run {rid}: not in flight (status cancelled)"


@pytest.mark.parametrize("kw,field,code", [
    (dict(problem=""), "problem", "INVALID_ARGUMENT"),
    (dict(problem="1+1=" * 3000), "problem", "INVALID_ARGUMENT"),
    (dict(problem="What is 3 × 4?"), "problem", "INVALID_ARGUMENT"),  # '×': not in the target's vocabulary
    (dict(capacity=0), "capacity", "INVALID_ARGUMENT"),
    (dict(capacity=2, swap=3), "swap", "INVALID_ARGUMENT"),
    (dict(method="beam"), "method", "INVALID_ARGUMENT"),
    (dict(decoding="medusa"), "decoding", "INVALID_ARGUMENT"),
    (dict(run_id="bad id!"), "run_id", "INVALID_ARGUMENT"),
    (dict(top_p=1.5), "top_p", "INVALID_ARGUMENT"),
    # more KV than a Target holds (600 blocks) is a request error: RESOURCE_EXHAUSTED sent clients to retry
    (dict(capacity=5000), "capacity", "INVALID_ARGUMENT"),
    (dict(capacity="fills the KV alone"), "", "RESOURCE_EXHAUSTED"),  # fits, but not beside the run in flight
])
def test_bad_input_and_overcommit_are_refused_while_another_run_goes_on(serve_stack, kw, field, code):
    bg = Background(serve_stack, max_tokens=60, top_p=0.9, top_k=20)  # a nucleus through the whole stack
    bg.wait_started()
    held = None
    if kw.get("capacity") == "fills the KV alone":  # beside a long run, admitted just before it
        most = max(c for c in range(1, 600) if kv_blocks(PROBLEMS[0], c, 60) <= 600)
        kw = dict(max_tokens=60, capacity=most)
        assert kv_blocks(PROBLEMS[0], most, 60) > 600 - kv_blocks(LONG, 8, 400)
        held = Background(serve_stack, max_tokens=400, seed=13, capacity=8, problem=LONG)
        held.wait_started()
    with pytest.raises(grpc.RpcError) as e:
        solve(serve_stack, **kw)
    if held is not None:
        assert held.join().result.status == "done"
    assert e.value.code().name == code
    assert e.value.details().startswith(f"{field}:") if field else "KV" in e.value.details()
    assert bg.join().result.status == "done"


def test_bearer_token_is_checked(serve_stack):
    for call in (lambda: solve(serve_stack, token=False),
                 lambda: stub(serve_stack).GetRun(pb2.GetRunRequest(run_id="x"), metadata=md(False))):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        stub(serve_stack).GetRun(pb2.GetRunRequest(run_id="never-was"), metadata=md())
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancel_run_and_client_disconnect_free_the_kv(serve_stack):
    keep = Background(serve_stack, max_tokens=100, seed=5)
    cancel = Background(serve_stack, max_tokens=400, seed=6, capacity=8, problem=LONG)
    rid = cancel.wait_started()
    # at once: a run of ~100 tokens per trace takes well under a second once the services are warm
    resp = stub(serve_stack).CancelRun(pb2.CancelRunRequest(run_id=rid), metadata=md())
    assert resp.cancelled
    gone = Background(serve_stack, max_tokens=400, seed=7, capacity=8, problem=LONG)
    gid = gone.wait_started()
    gone.call.cancel()  # the client goes away
    keep.wait_started()
    last = cancel.join()
    assert last.result.status == "cancelled", (len(cancel.events), last.result.total_s, resp)
    assert keep.join().result.status == "done"
    info = wait_for(lambda: (i := stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=gid), metadata=md()))
                    .status == "cancelled" and i)
    assert info and "stream closed" in info.result.message
    load = wait_for(lambda: (x := target_load())["runs"] == 0 and x)
    assert load and load["reserved_blocks"] == 0 and load["kv_usage"] == 0.0
    from ray import serve

    # what the Target reports to its KV-aware request router (kv_router), from the live replica
    stats = serve.get_deployment_handle("Target", app_name="gambit").record_routing_stats.remote().result(
        timeout_s=30)
    assert {k: stats[k] for k in ("runs", "reserved_blocks", "num_blocks")} == {
        "runs": 0, "reserved_blocks": 0, "num_blocks": 600}
    assert stats["block_size"] >= 1 and stats["max_model_len"] > 120 and stats["stamp"] > time.time() - 60
    again = stub(serve_stack).CancelRun(pb2.CancelRunRequest(run_id=rid), metadata=md())
    assert not again.cancelled and again.status == "cancelled"


def test_redis_unreachable_is_unavailable_and_runs_in_flight_finish(serve_stack):
    bg = Background(serve_stack, max_tokens=200, capacity=6, seed=8)
    bg.wait_started()
    serve_stack["proxy"].stop()
    try:
        for call in (lambda: solve(serve_stack),
                     lambda: stub(serve_stack).GetRun(pb2.GetRunRequest(run_id="x"), metadata=md())):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Redis" in e.value.details() and "unreachable" in e.value.details()
        assert bg.join().result.status == "done"
    finally:
        serve_stack["proxy"].start()
    assert wait_for(lambda: solve(serve_stack, max_tokens=40)[-1].result.status == "done", timeout=90)


def test_coordinator_calls_its_target_over_grpc(serve_stack):
    """The node asks for Serve's gRPC transport (SERVE_ENV); the handle the driver built (whose Serve
    was imported before that) must follow the node, not the driver: Ray actor calls doubled the
    Coordinator's CPU per run."""
    import ray

    def handle_transport(actor_self) -> tuple[bool, bool]:  # local: pickled by value to the replica
        co = actor_self._replica_impl._user_callable_wrapper._callable
        return co.target.handle_options._by_reference, co.stream.handle_options._by_reference

    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if "Coordinator" in a["name"])
    coordinator = ray.get_actor(name, namespace="serve")
    assert ray.get(coordinator.__ray_call__.remote(handle_transport)) == (False, False)
    assert solve(serve_stack, max_tokens=24)[-1].result.status == "done"


def test_coordinator_replica_killed_mid_run_ends_with_a_clear_status(serve_stack):
    import ray

    runs = [Background(serve_stack, max_tokens=300, capacity=6, seed=20 + i) for i in range(3)]
    ids = [b.wait_started() for b in runs]
    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if "Coordinator" in a["name"])
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    for b in runs:
        b.thread.join(240)

    def ended(rid):
        i = stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=rid), metadata=md())
        return i.status if i.status in ("done", "cancelled") else None

    for b, rid in zip(runs, ids, strict=True):
        status = wait_for(lambda rid=rid: ended(rid), timeout=120)
        if b.error is None:  # its coordinator survived: the stream finished normally
            assert b.events[-1].result.status == "done" == status
        else:  # its coordinator died: the run was stopped and says so, its KV freed
            assert status in ("cancelled", "done")
    assert wait_for(lambda: target_load()["runs"] == 0, timeout=60)
    assert wait_for(lambda: solve(serve_stack, max_tokens=40)[-1].result.status == "done", timeout=120)


def test_scorer_unreachable_run_continues_with_fallback(serve_stack):
    from ray import serve

    from gambit.deployments.app import build_scorer

    serve.delete("scorer")
    try:
        res = solve(serve_stack, max_tokens=100, seed=9)[-1].result
        assert res.status == "done" and res.scorer_fallbacks > 0 and res.answer
    finally:  # the stack's own Scorer again (a random MLP here left every later run unguided: it reads no
        # confidence features, the Targets send two; the Targets' Info check said so from stop 66)
        cfg = serve_stack["cfg"]
        serve.run(build_scorer({"scorer": cfg.scorer, "token_env": cfg.token_env, "model": cfg.model}),
                  name="scorer", route_prefix="/scorer", blocking=False)
    url = f"http://127.0.0.1:{serve_stack['cfg'].metrics_port}/metrics"
    assert wait_for(lambda: "ray_gambit_scorer_fallback_total" in
                    urllib.request.urlopen(url, timeout=10).read().decode(), timeout=60, every=2)


def test_target_replica_lost_mid_run_is_resumed_from_redis_by_its_replacement(serve_stack):
    import ray

    name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "Target" in a["name"])
    target = ray.get_actor(name, namespace="serve")
    pid = ray.get(target.__ray_call__.remote(lambda _: os.getpid()), timeout=60)
    # rounds every 4 steps: the two it waits for come early in the run (~0.25 s on a fast host), and the
    # replica's process dies at once (SIGKILL: a crash; `ray.kill` takes effect later, after the run had
    # ended once on a fast Intel host: one start, no resume)
    bg = Background(serve_stack, max_tokens=400, capacity=16, seed=31, problem=LONG, round_interval=4)
    rid = bg.wait_started()
    assert wait_for(lambda: len(bg.events) >= 3, timeout=60, every=0.005)  # two rounds, in Redis too
    r, prefix = serve_stack["redis"], serve_stack["prefix"]
    before = r.hgetall(f"{prefix}tree:run:{rid}:nodes")  # the rounds the client saw are there
    os.kill(pid, signal.SIGKILL)
    last = bg.join(240)
    assert last.result.status == "done", bg.events[-1]
    starts = [e.started for e in bg.events if e.WhichOneof("event") == "started"]
    assert [s.resumed for s in starts] == [False, True] and starts[0].replica != starts[1].replica
    rounds = [e.progress.round for e in bg.events if e.WhichOneof("event") == "progress"]
    assert rounds == sorted(rounds) and rounds[-1] > 2
    after = r.hgetall(f"{prefix}tree:run:{rid}:nodes")
    assert set(before) <= set(after) and len(before) >= 16  # nothing in Redis was lost
    assert {str(t.trace_id) for t in last.result.traces} == set(after)
    info = stub(serve_stack).GetRun(pb2.GetRunRequest(run_id=rid), metadata=md())
    assert info.status == "done" and info.num_traces == len(after)
    assert r.hget(f"{prefix}run:{rid}", "resumes") == "1"
    assert solve(serve_stack, max_tokens=40)[-1].result.status == "done"  # new runs are served again


def test_the_backend_example_solves_over_the_proxy_with_its_own_stubs(serve_stack, tmp_path):
    """`examples/solve_from_a_backend.py`, the README's backend client, against the running stack: stubs
    generated from the .proto alone, application metadata and bearer token sent, the stream printed; a
    bad request is the field's INVALID_ARGUMENT, a missing token UNAUTHENTICATED."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "solve_from_a_backend.py"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script imports grpc alone
    env["GAMBIT_TOKEN"] = os.environ["GAMBIT_TEST_SERVE_TOKEN"]

    def call(*args, token=True):
        e = env if token else {k: v for k, v in env.items() if k != "GAMBIT_TOKEN"}
        return subprocess.run([sys.executable, "-I", str(script), "--address", serve_stack["address"], *args],
                              capture_output=True, text=True, timeout=180, env=e, cwd=tmp_path)

    r = call("Compute (4+5)*3.", "--capacity", "4")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("run ") and "round 1:" in r.stdout and "done: answer '" in r.stdout
    assert ": gambit, C=4 K=1, 120 tokens a trace at most\n" in r.stdout  # the stack's defaults
    assert "\\boxed{" in r.stdout.split("solution: ")[1]
    # DeepConf's warm-up traces finish first: the rounds after show the answer leading so far
    r = call("Compute (4+5)*3-8.", "--capacity", "6", "--method", "deepconf")
    assert r.returncode == 0 and "; leading '" in r.stdout, r.stdout + r.stderr
    r = call("Compute 1+1.", "--capacity", "0")
    assert r.returncode == 2 and r.stderr.startswith("INVALID_ARGUMENT: capacity")
    r = call("Compute 1+1.", token=False)
    assert r.returncode == 2 and r.stderr.startswith("UNAUTHENTICATED")


def test_a_stopping_server_ends_its_runs_with_a_result_not_a_broken_stream(serve_stack):
    """`gambit serve` stopped on SIGINT / SIGTERM: its clients got `UNAVAILABLE: Stream removed` and no
    Result, the runs recorded as "client disconnected". The stop drains them first now: each stream ends
    with its Result (cancelled, "server shutting down"); a run another server holds is left alone."""
    from gambit.deployments.drain import SHUTTING_DOWN, drain, target_replicas
    from gambit.serving.tree_view import open_tree_view

    cfg = serve_stack["cfg"]
    tree = open_tree_view(cfg.tree, cfg.prefix)
    replicas = target_replicas()
    assert len(replicas) == cfg.target_replicas
    tree.put_run("held-elsewhere", status="running", replica="another-servers-replica")
    bg = Background(serve_stack, max_tokens=400, seed=12, capacity=8, problem=LONG)
    rid = bg.wait_started()
    t0 = time.monotonic()
    assert drain(tree, replicas, wait_s=20) == [rid]
    last = bg.join()
    assert last.WhichOneof("event") == "result", last
    assert (last.result.status, last.result.message) == ("cancelled", SHUTTING_DOWN)
    assert tree.get_run(rid)["status"] == "cancelled" and time.monotonic() - t0 < 20
    assert tree.get_run("held-elsewhere")["status"] == "running"
    load = wait_for(lambda: (x := target_load())["runs"] == 0 and x)
    assert load and load["reserved_blocks"] == 0
