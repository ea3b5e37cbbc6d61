"""The load test's own surface, without Ray: its checks, summary, failure grouping and the summary files,
and a short real Locust run against an in-process fake ReasoningService (a few seconds)."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gambit.ops import loadtest
from gambit.ops.loadtest import (
    FAILED,
    MAX_TOKENS_SCALE,
    LoadTestConfig,
    failure_kind,
    failure_lines,
    locust_command,
    read_summary,
    run_totals,
    summary_lines,
    summary_rows,
    write_summary,
)


class Entry:
    def __init__(self, times_ms, failures=0):
        self.times, self.num_requests, self.num_failures = sorted(times_ms), len(times_ms), failures
        self.avg_response_time = sum(times_ms) / max(len(times_ms), 1)

    def get_response_time_percentile(self, q):
        return self.times[min(int(q * len(self.times)), len(self.times) - 1)]


class Stats:
    def __init__(self, **by_name):
        self.entries = {(name, "grpc"): e for name, e in by_name.items()}


def test_percentiles_and_per_s_cover_the_calls_that_succeeded():
    """A refused call's 1 ms made the TTFT median 1 ms and "per s" counted failures as throughput."""
    stats = Stats(**{"Solve first event": Entry([20, 30, 40, 50]),
                     "Solve first event" + FAILED: Entry([1] * 6, failures=6),
                     "CancelRun" + FAILED: Entry([5], failures=1)})
    rows = {r["entry"]: r for r in summary_rows(stats, elapsed_s=2.0)}
    first = rows["Solve first event"]
    assert (first["requests"], first["failures"], first["per_s"]) == (10, 6, 2.0)
    assert first["p50_ms"] == 40 and first["mean_ms"] == 35.0
    # an entry with only failures: counted, no timings
    assert rows["CancelRun"] == {"entry": "CancelRun", "requests": 1, "failures": 1, "p50_ms": "",
                                 "p95_ms": "", "p99_ms": "", "mean_ms": "", "per_s": 0.0}
    assert list(rows) == ["Solve first event", "CancelRun"]


def test_failures_are_grouped_by_entry_and_code_with_one_sample():
    assert failure_kind("needs 46 KV blocks; 14 of 150") == failure_kind("needs 9 KV blocks; 3 of 150")
    assert failure_kind("RESOURCE_EXHAUSTED") == "RESOURCE_EXHAUSTED"
    failures = [("Solve first event (failed)", "RESOURCE_EXHAUSTED", 283),
                ("CancelRun (failed)", "NOT_FOUND", 2)]
    failures += [(f"e{i}", "UNAVAILABLE", 1) for i in range(30)]
    lines = failure_lines(failures,
                          {("Solve first event (failed)", "RESOURCE_EXHAUSTED"): "small-sc: 14 free"})
    assert lines[0] == "failure: Solve first event (failed): RESOURCE_EXHAUSTED x283 (e.g. small-sc: 14 free)"
    assert lines[1] == "failure: CancelRun (failed): NOT_FOUND x2"
    assert len(lines) == loadtest.FAILURE_LINES + 1 and lines[-1].startswith("... and 12 more failure kinds")


def test_the_headline_counts_task_errors_and_the_csv_stays_plain(tmp_path):
    """A task that raised every time was reported as "0 failures"; the "# …" line broke CSV readers."""
    totals = run_totals(4.0, runs=0, generated=0, request_failures=2, task_errors=33,
                        by_mix={"small-sc": [3, 2], "large-gambit": [1, 0]})
    assert (totals["failures"], totals["task_errors"]) == (35, 33)
    assert (totals["finished"], totals["correct"]) == (4, 2)
    lines = summary_lines([], totals, {"small-sc": [3, 2]})
    assert lines[0].startswith("Gambit load test: 4.0 s, 0 runs with a result")
    assert "35 failures (33 task errors)" in lines[0]
    rows = [{"entry": "CancelRun", "requests": 3, "failures": 0, "p50_ms": 9, "p95_ms": 9, "p99_ms": 9,
             "mean_ms": 9.0, "per_s": 0.75}]
    path = write_summary(tmp_path / "s.csv", rows, totals)
    with path.open(newline="") as f:
        assert [r["entry"] for r in csv.DictReader(f)] == ["CancelRun"]  # no stray "# …" row
    got, note = read_summary(path)
    assert got[0]["per_s"] == "0.75" and "failures=35" in note.split() and "correct=2" in note.split()


def test_options_are_checked_before_anything_starts(tmp_path, monkeypatch):
    for bad, match in [({"spawn_rate": float("inf")}, "spawn_rate must be a finite"),
                       ({"users": 10**11}, "users must be <= 10000"),
                       ({"max_tokens_scale": 1e8}, "max_tokens is a uint32"),
                       ({"cancel_fraction": -3}, r"cancel_fraction must be in \[0, 1\]"),
                       ({"grpc_port": 99999}, "grpc_port must be in"),
                       ({"summary_csv": str(tmp_path)}, "is a folder"),
                       ({"summary_csv": str(tmp_path / "f" / "s.csv")}, "is not a folder"),
                       ({"csv_prefix": ""}, "csv_prefix")]:
        (tmp_path / "f").write_text("")
        with pytest.raises(ValueError, match=match):
            LoadTestConfig(**bad)
    assert LoadTestConfig(max_tokens_scale=MAX_TOKENS_SCALE).max_tokens_scale * 224 < 2**32
    from gambit.config_cli import field_comments  # both help lines give the bound

    assert f"<= {MAX_TOKENS_SCALE}" in field_comments(LoadTestConfig)["max_tokens_scale"]
    assert f"<= {MAX_TOKENS_SCALE}" in loadtest.LOCUSTFILE.read_text()
    # options that only shape the local deployment, given with --address: refused, not ignored
    with pytest.raises(ValueError, match="--num-blocks, --model, --grpc-port only shape the local"):
        LoadTestConfig(address="127.0.0.1:9000", model="smollm2", num_blocks=5, grpc_port=9100)
    # relative paths are the caller's (Locust runs from the repo root), and say so absolute
    monkeypatch.chdir(tmp_path)
    cfg = LoadTestConfig(summary_csv="out/s.csv", csv_prefix="out/lt")
    assert cfg.summary_csv == str(tmp_path / "out" / "s.csv")
    assert cfg.csv_prefix == str(tmp_path / "out" / "lt")
    cmd = locust_command(cfg, "127.0.0.1:9000")
    assert cmd[cmd.index("--summary-csv") + 1] == str(tmp_path / "out" / "s.csv")


def test_the_ports_reach_the_local_deployment(monkeypatch, capsys, tmp_path):
    """Its "give other ports (--grpc-port …)" hint named flags `gambit loadtest` did not have."""
    from gambit.deployments import local

    got = {}
    monkeypatch.setattr(local, "start", lambda scfg, wait_s: got.update(scfg=scfg))
    monkeypatch.setattr(local, "stop", lambda: None)
    monkeypatch.setattr(loadtest, "stream", lambda cmd, timeout_s: (0, True))
    cfg = LoadTestConfig(grpc_port=9100, http_port=8100, metrics_port=8180,
                         csv_prefix=str(tmp_path / "lt"), summary_csv=str(tmp_path / "s.csv"))
    assert loadtest.main(cfg) == loadtest.INTERRUPTED
    assert (got["scfg"].grpc_port, got["scfg"].http_port, got["scfg"].metrics_port) == (9100, 8100, 8180)
    assert "leak check skipped (interrupted)" in capsys.readouterr().out


def test_with_an_address_the_skipped_leak_check_is_said(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(loadtest, "check_running", lambda cfg: "")
    monkeypatch.setattr(loadtest, "stream", lambda cmd, timeout_s: (0, False))
    cfg = LoadTestConfig(address="127.0.0.1:9", csv_prefix=str(tmp_path / "lt"))
    assert loadtest.main(cfg) == 0
    assert "leak check skipped (--address)" in capsys.readouterr().out


def test_one_ctrl_c_stops_locust_gracefully_and_is_reported(tmp_path):
    """Ctrl-C killed Locust before its summary and CSV, with a traceback here."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: (print('summary', flush=True), sys.exit(1)))\n"
             "print('ready', flush=True)\ntime.sleep(30)\n")
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    assert loadtest.stream([sys.executable, "-c", child], timeout_s=60) == (1, True)
    assert time.monotonic() - t0 < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


# a fake ReasoningService (and the Serve and Scorer calls the readiness probe makes), in this process


def _fake_server(token: str = ""):
    from ray.serve.generated import serve_pb2, serve_pb2_grpc

    from gambit.serving.protos import load

    pb2, g = load("reasoning")
    spb2, sg = load("scorer")

    def authorized(context):
        return not token or dict(context.invocation_metadata()).get("authorization") == f"Bearer {token}"

    class Serve(serve_pb2_grpc.RayServeAPIServiceServicer):
        def ListApplications(self, request, context):
            return serve_pb2.ListApplicationsResponse(application_names=["gambit", "scorer"])

    class Scorer(sg.ScorerServiceServicer):
        def Info(self, request, context):
            if not authorized(context):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            return spb2.InfoResponse()

    class Reasoning(g.ReasoningServiceServicer):
        def Solve(self, request, context):
            if request.seed % 3 == 0:  # a refusal whose details differ every time, as the Target's do
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"run needs up to {request.seed % 97} KV blocks; {request.seed % 13} free")
            run_id = f"r{request.seed}"
            yield pb2.SolveEvent(started=pb2.RunStarted(run_id=run_id))
            time.sleep(0.02)
            yield pb2.SolveEvent(progress=pb2.Progress(run_id=run_id))
            yield pb2.SolveEvent(result=pb2.Result(run_id=run_id, status="done", answer="0",
                                                   generated_tokens=10))

        def CancelRun(self, request, context):
            return pb2.CancelRunResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    serve_pb2_grpc.add_RayServeAPIServiceServicer_to_server(Serve(), server)
    sg.add_ScorerServiceServicer_to_server(Scorer(), server)
    g.add_ReasoningServiceServicer_to_server(Reasoning(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_refused_token_is_said_at_once(monkeypatch, tmp_path):
    """A wrong token was retried for 10 s, then called "no ReasoningService answers … start one"."""
    server, address = _fake_server(token="s3cret")
    try:
        monkeypatch.setenv("LT_TOKEN", "wrong")
        cfg = LoadTestConfig(address=address, token_env="LT_TOKEN", csv_prefix=str(tmp_path / "lt"))
        t0 = time.monotonic()
        why = loadtest.check_running(cfg)
        assert time.monotonic() - t0 < 3
        assert "refused the token (UNAUTHENTICATED" in why and "$LT_TOKEN" in why
        monkeypatch.setenv("LT_TOKEN", "s3cret")
        assert loadtest.check_running(cfg) == ""
    finally:
        server.stop(0)


def test_locust_against_a_fake_service_prints_its_table_and_grouped_failures(tmp_path):
    server, address = _fake_server()
    try:
        cfg = LoadTestConfig(address=address, users=3, spawn_rate=3, run_time_s=3, stop_timeout_s=5,
                             cancel_fraction=0.3, csv_prefix=str(tmp_path / "lt"),
                             summary_csv=str(tmp_path / "s.csv"))
        r = loadtest.run_locust(cfg, address)
    finally:
        server.stop(0)
    out = r.stdout
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # the refusals are failures
    assert "Gambit load test:" in out and "task errors" not in out, out[-3000:]
    refused = [ln for ln in out.splitlines() if ln.startswith("failure:")]
    assert len(refused) == 1 and refused[0].startswith(
        "failure: Solve first event (failed): RESOURCE_EXHAUSTED x"), refused
    assert "(e.g. " in refused[0] and "KV blocks" in refused[0]
    assert out.rstrip().splitlines()[-1].startswith(f"wrote {tmp_path / 's.csv'}")
    rows, note = read_summary(cfg.summary_csv)
    first = next(row for row in rows if row["entry"] == "Solve first event")
    assert int(first["failures"]) > 0 and int(first["requests"]) > int(first["failures"])
    elapsed = float(note.split("elapsed_s=")[1].split()[0])
    ok = int(first["requests"]) - int(first["failures"])
    assert abs(float(first["per_s"]) * elapsed - ok) < 0.1 * float(first["per_s"]) + 0.5  # successes only
    assert Path(str(tmp_path / "lt") + "_stats.csv").exists()


@pytest.mark.parametrize("args, said", [(["--cancel-fraction", "-3"], "cancel_fraction must be in [0, 1]"),
                                        (["--host", "127.0.0.1"], "--host: give the service's host:port"),
                                        (["--tls-ca", "/none/ca.pem"], "tls_ca: file /none/ca.pem does not")])
def test_locust_run_directly_refuses_a_bad_option_at_start(args, said):
    """Run directly, a bad option silently meant no cancels (or every task crashing, "0 failures")."""
    r = subprocess.run([sys.executable, "-m", "locust", "-f", str(loadtest.LOCUSTFILE), "--headless",
                        "--host", "127.0.0.1:9", "-u", "1", "-t", "30s", *args],
                       cwd=loadtest.REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr, r.stderr[-2000:]
