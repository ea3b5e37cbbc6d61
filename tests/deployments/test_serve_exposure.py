"""`gambit serve` and the interfaces it answers on: Ray binds its gRPC proxy to [::] whatever --host
says, so with no bearer token it warns in one line; ports Ray itself uses are refused before Ray starts.
No Ray is started here (``local.start`` is replaced)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

import pytest

from gambit.deployments import local
from gambit.serving import commands
from gambit.serving.security import open_server_warning


def _serve(monkeypatch, *flags: str) -> None:
    started = []
    monkeypatch.setattr(local, "start", lambda cfg: started.append(cfg))
    monkeypatch.setattr(local, "stop", lambda: None)
    monkeypatch.setattr(commands, "stop_signals", lambda: (lambda: signal.SIGINT))  # stopped at once
    monkeypatch.setattr(commands, "_drain", lambda cfg: None)
    parser = argparse.ArgumentParser()
    commands.add_commands(parser.add_subparsers())
    args = parser.parse_args(["serve", "--grpc-port", "19000", "--http-port", "19001", *flags])
    assert args.func(args) == 0 and len(started) == 1


def test_serve_warns_when_every_interface_answers_without_a_token(monkeypatch, capsys):
    monkeypatch.delenv("GAMBIT_TOKEN", raising=False)
    _serve(monkeypatch)
    out, err = capsys.readouterr()
    assert "gRPC proxy on port 19000 of every interface, HTTP proxy on 127.0.0.1:19001" in out
    (line,) = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert "[::]:19000" in line and "$GAMBIT_TOKEN unset" in line and "export GAMBIT_TOKEN=<secret>" in line
    assert "ready: ReasoningService at 127.0.0.1:19000" in out  # the address to dial is unchanged

    monkeypatch.setenv("GAMBIT_TEST_EXPOSURE_TOKEN", "s3cret")
    _serve(monkeypatch, "--token-env", "GAMBIT_TEST_EXPOSURE_TOKEN")
    assert "warning:" not in capsys.readouterr().err


def test_the_warning_says_how_to_set_a_token(monkeypatch):
    monkeypatch.delenv("GAMBIT_TEST_EXPOSURE_TOKEN", raising=False)
    line = open_server_warning("X on [::]:1", "GAMBIT_TEST_EXPOSURE_TOKEN")
    assert line.startswith("warning: X on [::]:1 answers anyone") and "\n" not in line
    assert "export GAMBIT_TEST_EXPOSURE_TOKEN=<secret>" in line
    assert "--token-env empty" in open_server_warning("X", "")  # no variable named: auth is off
    monkeypatch.setenv("GAMBIT_TEST_EXPOSURE_TOKEN", "t")
    assert open_server_warning("X", "GAMBIT_TEST_EXPOSURE_TOKEN") == ""


@pytest.mark.parametrize("flags, message", [
    (["--grpc-port", "6379"],
     "gambit serve: error: --grpc-port: 6379 is Ray's GCS port (and Redis's); give another"),
    (["--http-port", "8265"], "gambit serve: error: --http-port: 8265 is Ray's dashboard port; give another"),
    (["--grpc-port", "8000"],
     "gambit serve: error: --http-port and --grpc-port are both 8000; they must differ"),
])
def test_serve_refuses_ports_ray_uses_before_ray_starts(flags, message):
    """6379 was reported "in use (another gambit serve?)" (Redis holds it here), 8265 and two equal
    ports started Ray and failed later."""
    out = subprocess.run([sys.executable, "-m", "gambit.cli", "serve", *flags], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and out.stderr.strip() == message, out.stdout + out.stderr
    assert "Started a local Ray instance" not in out.stdout
