"""`examples/score_states.py` against a real ScorerService on 127.0.0.1 (a scorer that reads the confidence
features): the scores it prints are the in-process scorer's, its traces are dropped after, and a refused
token is one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "score_states.py"
H = 16


def call(port: int, token: str = "", *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "services"), "GAMBIT_TOKEN": token}
    return subprocess.run([sys.executable, str(SCRIPT), "--address", f"127.0.0.1:{port}", *args],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def server():
    os.environ["GAMBIT_F3_EXAMPLE_TOKEN"] = "s3cret"
    try:
        cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="GAMBIT_F3_EXAMPLE_TOKEN")
        srv = start_scorer_server(cfg, scorer=random_scorer("sequence", H, seed=3, confidence=True))
    finally:
        del os.environ["GAMBIT_F3_EXAMPLE_TOKEN"]
    yield srv
    srv.stop()


def test_the_example_prints_the_scorers_scores_and_drops_its_traces(server):
    r = call(server.port, "s3cret", "--rows", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"sequence scorer, d={H}, F=2"
    states = torch.randn(4, H, generator=torch.Generator().manual_seed(0))
    rows = torch.cat([states, torch.full((4, 2), -0.1)], dim=1)  # the features it sends, after each state
    ids = ["demo:0", "demo:1", "demo:0", "demo:1"]
    want = random_scorer("sequence", H, seed=3, confidence=True).score(ids, rows).tolist()
    assert lines[1:] == [f"{k}: {s:.6f}" for k, s in zip(ids, want, strict=True)]
    assert server.core.scorer.num_keys == 0


def test_a_refused_call_and_a_bad_flag_are_one_line(server):
    r = call(server.port, "wrong")
    assert r.returncode == 2 and r.stderr.strip() == "UNAUTHENTICATED: missing or wrong bearer token"
    r = call(server.port, "s3cret", "--rows", "0")
    assert r.returncode == 2 and "--rows must be in 1..100, got 0" in r.stderr and "Traceback" not in r.stderr


def test_the_example_reaches_a_tls_scorer_with_tls_ca_and_a_server_name(self_signed_cert):
    """It had only a plaintext channel: a TLS Scorer (`scorer serve --tls-cert`) was out of its reach."""
    crt, key = self_signed_cert("gambit.internal")
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env="", tls_cert=str(crt), tls_key=str(key))
    srv = start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=3))
    try:
        r = call(srv.port, "", "--tls-ca", str(crt), "--tls-server-name", "gambit.internal")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[0] == f"mlp scorer, d={H}, F=0"
        r = call(srv.port, "")  # plaintext at a TLS server
        assert r.returncode == 2 and r.stderr.startswith("UNAVAILABLE")
        r = call(srv.port, "", "--tls-server-name", "gambit.internal")
        assert r.returncode == 2 and "tls_ca: needed with" in r.stderr and "Traceback" not in r.stderr
    finally:
        srv.stop()
