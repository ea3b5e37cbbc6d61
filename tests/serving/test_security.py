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
