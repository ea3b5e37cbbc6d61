"""Bearer tokens and TLS files (gambit.serving.security): the check every server here uses."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from gambit.serving.security import BearerTokenInterceptor, TLSConfig, check_token


@pytest.mark.parametrize("value, ok", [
    ("Bearer t0k", True), ("bearer t0k", True), ("BEARER t0k", True), ("Bearer  t0k", True),
    ("Bearer t0kx", False), ("Bearer", False), ("t0k", False), ("Basic t0k", False), ("", False),
    ("Bearer T0K", False),  # the token itself is compared exactly
])
def test_the_scheme_is_case_insensitive_and_the_token_exact(value, ok):
    """RFC 7235: the auth scheme is case-insensitive; clients that send "bearer" were refused."""
    assert check_token([("authorization", value)], "t0k") is ok
    assert check_token([("authorization", value)], "") is True  # no token configured


def test_the_interceptor_takes_the_same_header():
    """`gambit scorer serve` refused `authorization: bearer s3cret` (the Ray path uses check_token)."""
    interceptor, handler = BearerTokenInterceptor("s3cret"), SimpleNamespace(unary_unary=True)

    def call(value):
        details = SimpleNamespace(method="/gambit.v1.ScorerService/Info",
                                  invocation_metadata=(("authorization", value),))
        return interceptor.intercept_service(lambda d: handler, details)

    assert call("bearer s3cret") is handler and call("Bearer s3cret") is handler
    assert call("bearer wrong") is not handler  # the refusing handler


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    for name in ("a", "b"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        str(d / f"{name}.key"), "-out", str(d / f"{name}.crt"), "-days", "1", "-subj",
                        "/CN=localhost"], check=True, capture_output=True)
    (d / "bad.pem").write_text("garbage\n")
    return d


def test_a_file_that_is_not_pem_is_refused_naming_the_flag(pem):
    """The scorer server then said "cannot listen there (port in use?)" of a free port."""
    bad = str(pem / "bad.pem")
    with pytest.raises(ValueError, match=r"tls cert \(--tls-cert\): .*bad.pem is not a PEM certificate"):
        TLSConfig(bad, bad)
    with pytest.raises(ValueError, match=r"tls key \(--tls-key\): .*bad.pem is not a PEM private key"):
        TLSConfig(str(pem / "a.crt"), bad)
    with pytest.raises(ValueError, match=r"tls client_ca \(--tls-client-ca\): .*bad.pem is not a PEM CA"):
        TLSConfig(str(pem / "a.crt"), str(pem / "a.key"), bad)
    with pytest.raises(ValueError, match=r"--tls-cert, --tls-key\): .*b.key is not an unencrypted private "
                                         r"key of the certificate .*a.crt"):
        TLSConfig(str(pem / "a.crt"), str(pem / "b.key"))
    assert TLSConfig(str(pem / "a.crt"), str(pem / "a.key"), str(pem / "b.crt")).enabled


def test_the_scorer_server_config_refuses_a_bad_pem(pem):
    from gambit.serving.scorer_server import ScorerServerConfig

    bad = str(pem / "bad.pem")
    with pytest.raises(ValueError, match="tls cert"):
        ScorerServerConfig(port=0, metrics_port=-1, tls_cert=bad, tls_key=bad)


@pytest.mark.parametrize("value, want", [("abc\n", "abc"), ("  abc \r\n", "abc"), ("", ""), ("\n", "")])
def test_read_token_strips_what_a_secret_file_leaves(monkeypatch, value, want):
    """`kubectl create secret --from-file` keeps the file's newline: the servers expected "abc\\n",
    which no client can send in a header (gRPC: INTERNAL "Invalid metadata")."""
    from gambit.serving.security import read_token

    monkeypatch.setenv("GAMBIT_TEST_TOKEN", value)
    assert read_token("GAMBIT_TEST_TOKEN") == want
    monkeypatch.delenv("GAMBIT_TEST_TOKEN")
    assert read_token("GAMBIT_TEST_TOKEN") == "" and read_token("") == ""


@pytest.mark.parametrize("value", ["ab\ncd", "ab\tcd", "t\u00f6ken", "ab\x7fcd"])
def test_read_token_refuses_what_no_header_can_carry_naming_the_variable(monkeypatch, value):
    from gambit.serving.security import read_token

    monkeypatch.setenv("GAMBIT_TEST_TOKEN", value)
    with pytest.raises(ValueError, match=r"^\$GAMBIT_TEST_TOKEN: the bearer token holds"):
        read_token("GAMBIT_TEST_TOKEN")


def test_a_token_with_a_trailing_newline_authenticates_server_and_client(monkeypatch):
    """The standalone Scorer and `gambit client` read the same variable; both strip it."""
    import grpc

    from gambit.scoring import random_scorer
    from gambit.serving.client import ConnectConfig, metadata
    from gambit.serving.protos import load
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
    from gambit.serving.security import auth_metadata, open_server_warning

    monkeypatch.setenv("GAMBIT_TEST_TOKEN", "abc\n")
    assert metadata(ConnectConfig(token_env="GAMBIT_TEST_TOKEN", application="")) == auth_metadata("abc")
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="GAMBIT_TEST_TOKEN"),
                              scorer=random_scorer("mlp", 8, seed=1))
    try:
        pb2, pb2_grpc = load("scorer")
        with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            info = pb2_grpc.ScorerServiceStub(ch).Info(pb2.InfoRequest(), metadata=auth_metadata("abc"),
                                                       timeout=10)
        assert info.hidden_size == 8
    finally:
        srv.stop()
    monkeypatch.setenv("GAMBIT_TEST_TOKEN", " \n")  # blank is no token: the open-server warning says so
    assert "with no bearer token" in open_server_warning("the server", "GAMBIT_TEST_TOKEN")


def test_the_readme_says_the_reasoning_service_is_plaintext_and_what_the_tls_flags_are_for():
    """It said "the client takes --tls-ca", read as TLS to `gambit serve`, whose gRPC proxy has none."""
    import inspect
    import re
    from pathlib import Path

    from gambit.deployments.target import Target
    from gambit.serving.client import ConnectConfig

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\nSecurity:\n", 1)[1].split("\n\n", 1)[0]
    assert "ReasoningService on :9000 (Ray Serve's gRPC proxy) speaks plaintext only" in section
    assert "Envoy" in section and 'backend-protocol: "GRPC"' in section  # a way to put TLS in front
    for flag in ("--tls-ca", "--tls-server-name", "--tls-cert", "--tls-key"):  # each one a client flag
        assert f"`gambit client {flag}" in section or flag in section
        assert hasattr(ConnectConfig, flag[2:].replace("-", "_"))
    params = inspect.signature(Target.func_or_class.__init__).parameters
    for arg in set(re.findall(r"scorer_tls_\w+", section)) | {"scorer_address"}:
        assert arg in params, arg  # the Target arguments the section names exist
