"""TLS clients against a real TLS ScorerService on 127.0.0.1: a certificate for another name
(``--tls-server-name``), mTLS with and without a client certificate, the hints of a plaintext client
meeting a TLS server (and back), and a Target scoring through TLS with no fallback."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import grpc
import pytest
import torch

from gambit.cli import main
from gambit.scoring import random_scorer
from gambit.serving.protos import load
from gambit.serving.scorer_client import RemoteScorer
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
from gambit.serving.security import open_channel

H = 192  # the shipped target's hidden size
NAME = "gambit.internal"  # the only name in the server's certificate: 127.0.0.1 needs the override


def self_signed(d, stem: str, cn: str) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for ``cn``, and its key."""
    crt, key = d / f"{stem}.crt", d / f"{stem}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", f"/CN={cn}",
                    "-addext", f"subjectAltName=DNS:{cn}"], check=True, capture_output=True)
    return str(crt), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    server, client = self_signed(d, "server", NAME), self_signed(d, "client", "a-target")
    (d / "bad.pem").write_text("not pem\n")
    return SimpleNamespace(server=server, client=client, other=self_signed(d, "other", NAME),
                           bad=str(d / "bad.pem"))


def serve(pki, mtls: bool = False, token_env: str = ""):
    cfg = ScorerServerConfig(port=0, metrics_port=-1, token_env=token_env, tls_cert=pki.server[0],
                             tls_key=pki.server[1], tls_client_ca=pki.client[0] if mtls else "")
    return start_scorer_server(cfg, scorer=random_scorer("mlp", H, seed=1))


@pytest.fixture(scope="module")
def tls_server(pki):
    srv = serve(pki)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mtls_server(pki):
    srv = serve(pki, mtls=True)
    yield srv
    srv.stop()


def info(address: str, **tls):
    pb2, g = load("scorer")
    with open_channel(address, **tls) as ch:
        return g.ScorerServiceStub(ch).Info(pb2.InfoRequest(), timeout=10)


def test_a_certificate_for_another_name_needs_the_server_name_override(pki, tls_server):
    address = f"127.0.0.1:{tls_server.port}"
    with pytest.raises(grpc.RpcError, match="Hostname Verification"):
        info(address, tls_ca=pki.server[0])
    assert info(address, tls_ca=pki.server[0], server_name=NAME).hidden_size == H
    with pytest.raises(ValueError, match="tls_ca: a client certificate or server name needs TLS"):
        open_channel(address, server_name=NAME)  # plaintext would drop it silently


def test_mtls_with_and_without_a_client_certificate(pki, mtls_server):
    address = f"127.0.0.1:{mtls_server.port}"
    tls = dict(tls_ca=pki.server[0], tls_server_name=NAME)
    x = torch.randn(3, H)
    want = random_scorer("mlp", H, seed=1).score([0, 1, 2], x)
    with_cert = RemoteScorer(address, H, tls_cert=pki.client[0], tls_key=pki.client[1], **tls)
    assert torch.allclose(with_cert.score(["a", "b", "c"], x), want, atol=1e-6)
    assert with_cert.fallbacks == 0
    without = RemoteScorer(address, H, timeout_s=2.0, **tls)
    without.score(["a", "b", "c"], x)
    assert without.fallbacks == 1 and without.last_error.startswith("UNAVAILABLE")
    other = RemoteScorer(address, H, tls_cert=pki.other[0], tls_key=pki.other[1], timeout_s=2.0, **tls)
    other.score(["a"], x[:1])  # a certificate the server's --tls-client-ca did not sign
    assert other.fallbacks == 1
    for c in (with_cert, without, other):
        c.close()


def test_gambit_client_takes_a_client_certificate_and_a_server_name(pki, mtls_server, capsys):
    """The Scorer does not serve ReasoningService: UNIMPLEMENTED means the TLS handshake (and the client
    certificate) got through; before, `gambit client` had no flag for either."""
    flags = ["--address", f"127.0.0.1:{mtls_server.port}", "--tls-ca", pki.server[0],
             "--tls-server-name", NAME]
    assert main(["client", "get", "r1", *flags, "--tls-cert", pki.client[0], "--tls-key", pki.client[1]]) == 1
    assert "error: UNIMPLEMENTED" in capsys.readouterr().err
    assert main(["client", "get", "r1", *flags]) == 1
    err = capsys.readouterr().err  # was "no server answers" of a server that asked for a certificate
    assert "error: UNAVAILABLE" in err and "may ask for a client certificate: pass --tls-cert/--tls-key" \
        in err
    other = ["--tls-cert", pki.other[0], "--tls-key", pki.other[1]]
    assert main(["client", "get", "r1", *flags, *other]) == 1
    err = capsys.readouterr().err
    assert "did not take --tls-cert (is it signed by the server's --tls-client-ca?)" in err


def test_the_client_says_which_side_speaks_tls(pki, tls_server, capsys):
    """A plaintext client at a TLS server was told "no server answers" of a server that had answered."""
    from gambit.serving.scorer_server import ScorerServerConfig as Cfg

    address = f"127.0.0.1:{tls_server.port}"
    assert main(["client", "get", "r1", "--address", address]) == 1
    assert "or it speaks TLS: pass --tls-ca" in capsys.readouterr().err
    assert main(["client", "get", "r1", "--address", address, "--tls-ca", pki.server[0]]) == 1
    assert f"the server at {address} has a certificate for another name: pass it as --tls-server-name" \
        in capsys.readouterr().err
    assert main(["client", "get", "r1", "--address", address, "--tls-ca", pki.other[0],
                 "--tls-server-name", NAME]) == 1
    assert "has a certificate that --tls-ca" in capsys.readouterr().err
    plain = start_scorer_server(Cfg(port=0, metrics_port=-1, token_env=""), scorer=random_scorer("mlp", H))
    try:
        assert main(["client", "get", "r1", "--address", f"127.0.0.1:{plain.port}", "--tls-ca",
                     pki.server[0]]) == 1
        assert "speaks plaintext, as `gambit serve` does: drop --tls-ca" in capsys.readouterr().err
    finally:
        plain.stop()


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert", "C"], "--tls-ca: needed with --tls-cert/--tls-key/--tls-server-name"),
    (["--tls-server-name", NAME], "--tls-ca: needed with"),
    (["--tls-ca", "CA", "--tls-cert", "C"], "--tls-cert, --tls-key: a client certificate and its key go"),
    (["--tls-ca", "BAD"], "--tls-ca: .*bad.pem is not a PEM CA certificate"),
    (["--tls-ca", "CA", "--tls-cert", "C", "--tls-key", "OK"], "--tls-key: .*other.key is not an unencrypted "
                                                               "private key of the certificate .*client.crt"),
])
def test_client_tls_flags_are_checked_naming_the_field(pki, flags, message):
    """A wrong or missing file was UNAVAILABLE at the handshake, or a traceback from open()."""
    files = {"C": pki.client[0], "CA": pki.server[0], "BAD": pki.bad, "OK": pki.other[1]}
    with pytest.raises(SystemExit, match=message):
        main(["client", "get", "r1", *[files.get(f, f) for f in flags]])


def test_an_embedded_target_scores_through_a_tls_scorer(pki, monkeypatch):
    """The Target had no way to give RemoteScorer a CA: every call to a TLS Scorer fell back."""
    from gambit.serving.embedded import Embedded, EmbeddedConfig
    from gambit.serving.solve_config import SolveConfig

    monkeypatch.setenv("GAMBIT_S3_TLS_TOKEN", "t0k")
    srv = serve(pki, mtls=True, token_env="GAMBIT_S3_TLS_TOKEN")
    cfg = EmbeddedConfig(scorer="random:mlp:192", scorer_address=f"127.0.0.1:{srv.port}",
                         scorer_tls_ca=pki.server[0], scorer_tls_cert=pki.client[0],
                         scorer_tls_key=pki.client[1], scorer_tls_server_name=NAME, num_blocks=200)
    emb = Embedded(cfg, token="t0k")
    try:
        events = list(emb.solve("Compute 2+3.", SolveConfig(capacity=2, swap=1, round_interval=8, warmup=2,
                                                            max_tokens=48, seed=1)))
        res = events[-1]
        assert res["kind"] == "result" and res["status"] == "done", res.get("message")
        assert res["scorer_fallbacks"] == 0, res.get("message")
        assert emb.target.scorer.calls > 0 and srv.core.calls > 0
    finally:
        emb.close()
        srv.stop()


def test_embedded_and_target_tls_settings_are_checked_and_passed(pki, monkeypatch):
    from gambit.deployments import target as target_mod
    from gambit.serving.embedded import EmbeddedConfig

    with pytest.raises(ValueError, match="scorer_tls_ca: set only with scorer_address"):
        EmbeddedConfig(scorer_tls_ca=pki.server[0])
    with pytest.raises(ValueError, match="scorer_tls_cert, scorer_tls_key: a client certificate and its"):
        EmbeddedConfig(scorer_address="h:1", scorer_tls_ca=pki.server[0], scorer_tls_cert=pki.client[0])
    seen = {}
    monkeypatch.setattr(target_mod, "build_target", lambda cfg, *a, **kw: seen.update(cfg=cfg, **kw))
    monkeypatch.setattr(target_mod.serve, "get_replica_context",
                        lambda: SimpleNamespace(replica_id=SimpleNamespace(unique_id="r")))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    target_mod.Target.func_or_class(scorer_address="10.0.0.5:50061", scorer_tls_ca=pki.server[0],
                                    scorer_tls_server_name=NAME)
    cfg = seen["cfg"]
    assert (cfg.scorer_tls_ca, cfg.scorer_tls_server_name) == (pki.server[0], NAME)
    assert seen["resolve"] is None  # the Ray Scorer's direct endpoint is plaintext: not looked up
