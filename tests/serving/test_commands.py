"""``gambit scorer serve`` (and ``gambit serve``, through the same wait) stops cleanly on SIGINT and SIGTERM,
also when started in the background by a script, where SIGINT arrives ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_scorer_server_stops_on_a_signal_even_when_sigint_came_ignored(sig):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gambit.cli", "scorer", "serve", "--scorer", "mlp", "--port", "0",
         "--metrics-port", "-1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as `cmd &` in a script starts it
    try:
        lines, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("ScorerService on "):
                break
        assert lines and lines[-1].startswith("ScorerService on "), "".join(lines)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert f"{sig.name}: stopping" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_gambit_serve_refuses_a_taken_port_before_ray_starts():
    """Serve's gRPC proxy binds with SO_REUSEPORT: `gambit serve` beside a running `serve run` said
    "ready" while the other server answered its clients (seen by hand in stop 59)."""
    import socket

    with socket.socket() as held, socket.socket() as s2, socket.socket() as s3:
        held.bind(("127.0.0.1", 0))
        held.listen()
        s2.bind(("127.0.0.1", 0))  # two free ports for HTTP and metrics, released before the call
        s3.bind(("127.0.0.1", 0))
        grpc_port, http, metrics = held.getsockname()[1], s2.getsockname()[1], s3.getsockname()[1]
        s2.close()
        s3.close()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gambit.cli", "serve", "--grpc-port", str(grpc_port),
                              "--http-port", str(http), "--metrics-port", str(metrics)],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"in use on this machine: grpc-port {grpc_port}" in out.stderr
    assert "Started a local Ray instance" not in out.stdout + out.stderr and time.monotonic() - t0 < 60


def test_busy_ports_sees_a_listener_and_not_a_free_port():
    import socket

    from gambit.deployments.local import busy_ports

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert busy_ports([port]) == [port]
    assert busy_ports([port], wait_s=1.0) == []  # released once closed


@pytest.mark.parametrize("flags, message, code", [
    (["--tree", "redis://127.0.0.1:1/0"],
     "error: tree store (Redis at redis://127.0.0.1:1/0) unreachable", 2),
    (["--model", "llama3"],
     "error: llama3: model folder does not exist, nor a model name (known: smollm2)", 2),
    # a bad run default stopped every Coordinator replica once Ray had started (named as its flag)
    (["--capacity", "0"], "gambit serve: error: --capacity: C must be >= 1, got 0", 2),
])
def test_gambit_serve_says_what_it_cannot_start_with_before_ray_starts(flags, message, code):
    """It failed after starting Ray with a traceback ending "Failed to update the deployments ['Target']"
    (or ['Scorer']), the reason (the run store does not answer, no such model) only in a replica's log."""
    import socket

    free = []
    for _ in range(3):  # ports of its own, so a server elsewhere on the machine does not decide the test
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            free.append(str(s.getsockname()[1]))
    out = subprocess.run([sys.executable, "-m", "gambit.cli", "serve", *flags,
                          "--grpc-port", free[0], "--http-port", free[1], "--metrics-port", free[2]],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == code, out.stdout + out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr and "Started a local Ray instance" not in out.stdout + out.stderr


def test_the_serve_stop_drains_its_runs_and_goes_on_whatever_fails(monkeypatch, capsys):
    """`gambit serve`'s stop ends the runs in flight with a Result first (gambit.deployments.drain);
    a drain that fails (Redis gone) must not keep Serve and Ray from stopping."""
    from gambit.deployments import drain
    from gambit.deployments.local import ServeConfig
    from gambit.serving import commands

    seen = {}

    def fake_drain(tree, replicas, wait_s=10.0):
        seen["replicas"] = replicas
        for r in ("r1", "r2"):
            tree.put_run(r, status="cancelled", replica="rep-a")
        return ["r1", "r2"]

    monkeypatch.setattr(drain, "target_replicas", lambda app="gambit": {"rep-a"})
    monkeypatch.setattr(drain, "drain", fake_drain)
    commands._drain(ServeConfig(tree="memory"))
    assert seen["replicas"] == {"rep-a"}
    said = capsys.readouterr().out.strip()
    assert said == f"{drain.SHUTTING_DOWN}: 2 of 2 run(s) in flight ended (cancelled 2)"

    def slow_drain(tree, replicas, wait_s=10.0):  # r2 ended on its own; r3 still runs at the deadline
        tree.put_run("r1", status="cancelled", replica="rep-a")
        tree.put_run("r2", status="done", replica="rep-a")
        tree.put_run("r3", status="running", replica="rep-a")
        return ["r1", "r2", "r3"]

    monkeypatch.setattr(drain, "drain", slow_drain)
    commands._drain(ServeConfig(tree="memory"))  # it said "3 run(s) in flight ended cancelled"
    assert capsys.readouterr().out.strip() == (
        f"{drain.SHUTTING_DOWN}: 2 of 3 run(s) in flight ended (cancelled 1, done 1); 1 had not ended when "
        "the drain's wait ran out (no Result reached their clients; GetRun shows how they end)")

    def broken(tree, replicas, wait_s=10.0):
        raise ConnectionError("redis went away")

    monkeypatch.setattr(drain, "drain", broken)
    commands._drain(ServeConfig(tree="memory"))  # no raise: the stop goes on
    assert "runs in flight not drained (ConnectionError: redis went away)" in capsys.readouterr().out


@pytest.mark.parametrize("host, token, warned", [("0.0.0.0", "", True), ("0.0.0.0", "s3cret", False),
                                                 ("127.0.0.1", "", False), ("::1", "", False)])
def test_the_scorer_server_warns_on_every_interface_without_a_token(monkeypatch, capsys, host, token, warned):
    """`gambit scorer serve --host 0.0.0.0` with no token said nothing (`gambit serve` warns), and
    `--metrics-port -1` printed "metrics on 127.0.0.1:-1". Nothing is bound here: the server is faked."""
    from types import SimpleNamespace

    from gambit.cli import build_parser
    from gambit.serving import commands, scorer_server

    stopped = []
    fake = SimpleNamespace(port=50061, metrics_port=-1, stop=lambda: stopped.append(1))
    monkeypatch.setattr(scorer_server, "start_scorer_server", lambda cfg: fake)
    monkeypatch.setattr(commands, "stop_signals", lambda: lambda: signal.SIGINT)
    monkeypatch.setenv("GAMBIT_F3_TOKEN", token)
    args = build_parser().parse_args(["scorer", "serve", "--host", host, "--metrics-port", "-1",
                                      "--token-env", "GAMBIT_F3_TOKEN"])
    assert args.func(args) == 0 and stopped == [1]
    out, err = capsys.readouterr()
    assert out.startswith(f"ScorerService on {host}:50061, metrics off; Ctrl-C stops")
    assert ("warning: ScorerService on 0.0.0.0:50061 answers anyone" in err) == warned, err
    assert "$GAMBIT_F3_TOKEN unset" in err if warned else err == ""


def test_the_scorer_server_refuses_a_folder_of_another_width_than_its_model(tmp_path):
    """`gambit scorer serve --scorer FOLDER` served a folder of any width: a Target of another width then
    got every Score call refused and its runs ended "done" on 0.5 scores. It reads the width of --model
    now (default: the shipped target), so such a folder is refused at start, in one line."""
    from gambit.cli import build_parser
    from gambit.scoring.scorer import random_scorer, save_scorer
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

    wide = random_scorer("mlp", 576)
    save_scorer(wide, wide.config, tmp_path / "w576")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "gambit.cli", "scorer", "serve", "--scorer",
                          str(tmp_path / "w576"), "--port", "0", "--metrics-port", "-1"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("gambit scorer serve: error: --scorer ")
    assert "width 576, the model's hidden size is 192" in out.stderr
    srv = start_scorer_server(ScorerServerConfig(scorer=str(tmp_path / "w576"), model="smollm2", port=0,
                                                 metrics_port=-1, token_env=""))
    try:
        assert srv.core.scorer.hidden_size == 576  # the model it names reads that width
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="--model 'nope': nope: model folder does not exist"):
        ScorerServerConfig(model="nope")
    with pytest.raises(ValueError, match="--scorer 'confidence:192' reads width 192, but --model 'smollm2' "
                                         "has hidden size 576"):
        start_scorer_server(ScorerServerConfig(scorer="confidence:192", model="smollm2", port=0,
                                               metrics_port=-1, token_env=""))
    assert build_parser().parse_args(["scorer", "serve", "--model", "smollm2"]).model == "smollm2"
    text = subprocess.run([sys.executable, "-m", "gambit.cli", "scorer", "serve", "--help"],
                          capture_output=True, text=True, env=env, timeout=120).stdout
    assert "--model MODEL" in text and "confidence[:H]" in " ".join(text.split())
