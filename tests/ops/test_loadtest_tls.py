"""The load test through a TLS proxy (--tls-ca, --tls-server-name): its checks, the readiness probe and a
short Locust run against a real TLS server on 127.0.0.1 (a ScorerServer: its UNIMPLEMENTED for every
ReasoningService call proves the users' handshake)."""

from __future__ import annotations

import pytest

from gambit.ops import loadtest
from gambit.ops.loadtest import LoadTestConfig, locust_command, read_summary
from gambit.scoring import random_scorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

NAME = "gambit.internal"  # the only name in the server's certificate: 127.0.0.1 needs --tls-server-name


@pytest.fixture(scope="module")
def tls_server(self_signed_cert):
    crt, key = self_signed_cert(NAME)
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="", tls_cert=str(crt),
                                                 tls_key=str(key)), scorer=random_scorer("mlp", 192, seed=1))
    yield f"127.0.0.1:{srv.port}", str(crt)
    srv.stop()


def test_tls_options_are_checked_before_anything_starts(tmp_path, monkeypatch):
    """There were no TLS options: against a TLS proxy every call failed UNAVAILABLE."""
    address = "127.0.0.1:9443"
    with pytest.raises(ValueError, match="tls_ca: file .*none.pem does not exist"):
        LoadTestConfig(address=address, tls_ca=str(tmp_path / "none.pem"))
    with pytest.raises(ValueError, match="tls_ca: needed with"):
        LoadTestConfig(address=address, tls_server_name=NAME)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    with pytest.raises(ValueError, match="tls_ca: the local deployment the load test starts speaks plain"):
        LoadTestConfig(tls_ca=str(tmp_path / "ca.pem"))
    monkeypatch.chdir(tmp_path)  # a relative CA is the caller's: Locust runs from the repo root
    cfg = LoadTestConfig(address=address, tls_ca="ca.pem", tls_server_name=NAME)
    cmd = locust_command(cfg, address)
    assert cmd[cmd.index("--tls-ca") + 1] == str(tmp_path / "ca.pem")
    assert cmd[cmd.index("--tls-server-name") + 1] == NAME


def test_the_readiness_probe_goes_through_tls(tls_server, tmp_path):
    address, ca = tls_server
    cfg = LoadTestConfig(address=address, token_env="", tls_ca=ca, tls_server_name=NAME,
                         csv_prefix=str(tmp_path / "lt"))
    assert loadtest.check_running(cfg) == ""
    cfg.tls_server_name = "other.name"
    why = loadtest.check_running(cfg)
    assert why.startswith(f"no service answers through TLS at {address} (UNAVAILABLE"), why
    assert "--tls-server-name" in why


def test_locust_users_call_through_tls(tls_server, tmp_path):
    address, ca = tls_server
    cfg = LoadTestConfig(address=address, users=1, spawn_rate=1, run_time_s=2, stop_timeout_s=5,
                         token_env="", tls_ca=ca, tls_server_name=NAME, csv_prefix=str(tmp_path / "lt"),
                         summary_csv=str(tmp_path / "s.csv"))
    r = loadtest.run_locust(cfg, address)
    failures = [ln for ln in r.stdout.splitlines() if ln.startswith("failure:")]
    # the handshake held: the server answered (no such service), where plaintext got UNAVAILABLE
    assert failures and all(": UNIMPLEMENTED x" in ln for ln in failures), r.stdout[-3000:] + r.stderr[-2000:]
    rows, _ = read_summary(cfg.summary_csv)
    assert int(next(row for row in rows if row["entry"] == "Solve first event")["failures"]) > 0
