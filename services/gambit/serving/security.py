"""Bearer-token auth and TLS options for every gRPC server and client here."""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

_HEALTH_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


@dataclass
class TLSConfig:
    """PEM files; all empty means plaintext (only for 127.0.0.1)."""

    cert: str = ""  # server certificate chain (PEM)
    key: str = ""  # server private key (PEM)
    client_ca: str = ""  # when set, clients must present a certificate signed by this CA (mTLS)

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("tls: cert and key must be given together")
        for name, what in (("cert", "certificate"), ("key", "private key"), ("client_ca", "CA certificate")):
            if getattr(self, name):  # gRPC said "port in use?" at the bind
                check_pem(getattr(self, name), what, f"tls {name}",
                          f"tls {name} (--tls-{name.replace('_', '-')})")
        if self.cert:
            check_key_of(self.cert, self.key, "tls cert, key (--tls-cert, --tls-key)")

    @property
    def enabled(self) -> bool:
        return bool(self.cert)

    def server_credentials(self) -> grpc.ServerCredentials:
        ca = Path(self.client_ca).read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials([(Path(self.key).read_bytes(), Path(self.cert).read_bytes())],
                                           root_certificates=ca, require_client_auth=ca is not None)


def add_port(server: grpc.Server, address: str, tls: TLSConfig | None) -> int:
    if tls is not None and tls.enabled:
        return server.add_secure_port(address, tls.server_credentials())
    return server.add_insecure_port(address)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` (health and reflection stay open).
    ``on_deny``: called with the method of each call refused (e.g. to count it), the token checked once."""

    def __init__(self, token: str, on_deny: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("token must be non-empty")
        self._token, self._on_deny = token, on_deny

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = deny

    def intercept_service(self, continuation, details):
        if details.method.startswith(_HEALTH_PREFIXES):
            return continuation(details)
        if check_token(details.invocation_metadata, self._token):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None
        if self._on_deny is not None:
            self._on_deny(details.method)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._deny)
        return grpc.unary_stream_rpc_method_handler(self._deny)


def check_token(metadata, token: str) -> bool:
    """True when ``metadata`` (pairs) carries ``authorization: Bearer <token>`` (or no token is
    configured)."""
    if not token:
        return True
    scheme, _, got = dict(metadata or ()).get("authorization", "").partition(" ")
    # the scheme is case-insensitive (RFC 7235: clients send "bearer" too); the token compared in
    # constant time
    return scheme.lower() == "bearer" and hmac.compare_digest(got.strip().encode(), token.encode())


def check_address(address: str, name: str = "address") -> None:
    """A ``host:port`` whose port gRPC would dial as given: it takes one past 65535 modulo 2^16
    (127.0.0.1:99999 dialled :34463, someone else's)."""
    _, sep, port = address.rpartition(":")
    if sep and port.isdigit() and not 0 < int(port) < 65536:
        raise ValueError(f"{name}: port {port} is not a TCP port (1-65535), in {address!r}")


def open_channel(address: str, tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 options=None, server_name: str = "") -> grpc.Channel:
    """Plaintext channel, or TLS with a CA (and a client certificate for mTLS). ``server_name``: the
    host the server's certificate names, where ``address`` reaches it by another name or an IP."""
    if tls_ca:
        creds = grpc.ssl_channel_credentials(
            Path(tls_ca).read_bytes(), Path(tls_key).read_bytes() if tls_key else None,
            Path(tls_cert).read_bytes() if tls_cert else None)
        if server_name:
            options = [*(options or ()), ("grpc.ssl_target_name_override", server_name)]
        return grpc.secure_channel(address, creds, options=options)
    if server_name or tls_cert:  # a plaintext channel would drop them silently
        raise ValueError("tls_ca: a client certificate or server name needs TLS (a CA to verify the server)")
    return grpc.insecure_channel(address, options=options)


def check_pem(path: str, what: str, where: str, flagged: str = "") -> None:
    """``path`` exists and holds a PEM ``what`` ("certificate", "CA certificate" or "private key"), else
    ValueError starting ``where`` (``flagged`` for a file that is there but no PEM: it names the flag)."""
    if not Path(path).is_file():
        raise ValueError(f"{where}: file {path} does not exist")
    marker = b"PRIVATE KEY-----" if what == "private key" else b"-----BEGIN CERTIFICATE-----"
    if marker not in Path(path).read_bytes():
        raise ValueError(f"{flagged or where}: {path} is not a PEM {what}")


def check_key_of(cert: str, key: str, where: str) -> None:
    """``key`` is the unencrypted private key of ``cert`` (gRPC cannot ask for a password, and reports a
    mismatch only at the handshake), else ValueError starting ``where``."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password="")
    except ssl.SSLError as e:
        raise ValueError(f"{where}: {key} is not an unencrypted private key of the certificate {cert} "
                         f"({e})") from None


def check_tls_pairs(prefix: str, ca: str, cert: str, key: str, server_name: str,
                    peer: str = "server") -> None:
    """A client's TLS settings that go together, without reading the files: a certificate, key or server name
    needs the CA (a plaintext channel drops them), a certificate its key. ``peer``: who the CA verifies."""
    if (cert or key or server_name) and not ca:
        raise ValueError(f"{prefix}ca: needed with {prefix}cert/{prefix}key/{prefix}server_name (they are "
                         f"for TLS; the CA verifies the {peer})")
    if bool(cert) != bool(key):
        raise ValueError(f"{prefix}cert, {prefix}key: a client certificate and its key go together")


def check_client_tls(prefix: str, ca: str, cert: str = "", key: str = "", server_name: str = "") -> None:
    """A client's TLS files, checked before any call: gRPC reports a missing, mismatched or non-PEM one
    only as UNAVAILABLE at the handshake. ``prefix`` names the fields ("tls_" gives "tls_cert")."""
    check_tls_pairs(prefix, ca, cert, key, server_name)
    for name, p, what in (("ca", ca, "CA certificate"), ("cert", cert, "certificate"),
                          ("key", key, "private key")):
        if p:
            check_pem(p, what, f"{prefix}{name}")
    if cert:
        check_key_of(cert, key, f"{prefix}key")


def open_server_warning(what: str, token_env: str) -> str:
    """One line for a server that answers on every interface: "" when its bearer token is set, else how to
    set one (``what`` names the server and what it listens on)."""
    if token_env and os.environ.get(token_env, "").strip():  # read_token strips it
        return ""
    unset, how = (f"${token_env} unset", f"export {token_env}=<secret>") if token_env else \
        ("--token-env empty", "--token-env GAMBIT_TOKEN and export GAMBIT_TOKEN=<secret>")
    return (f"warning: {what} answers anyone who reaches this machine, with no bearer token ({unset}): "
            f"{how} for the server and its clients, or firewall the port")


def read_token(env_name: str) -> str:
    """The bearer token in ``$env_name`` ("" when the name is empty or the variable unset), stripped: a
    Secret made from a file keeps its trailing newline, which no client can send in a header. Anything
    but printable ASCII left inside is refused, naming the variable (gRPC said "Invalid metadata")."""
    raw = os.environ.get(env_name, "") if env_name else ""
    token = raw.strip()
    bad = next((c for c in token if not " " <= c <= "~"), None)
    if bad is not None:
        raise ValueError(f"${env_name}: the bearer token holds {bad!r} at position {token.index(bad)}; "
                         "a gRPC header takes printable ASCII only")
    return token


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
