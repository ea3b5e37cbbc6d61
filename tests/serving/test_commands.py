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
