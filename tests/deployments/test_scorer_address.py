"""The address a Scorer replica advertises for its direct endpoint (``deployments.scorer``)."""

import grpc
import pytest

from gambit.deployments.scorer import advertised_address


def test_a_wildcard_bind_advertises_the_node_ip_bracketed_when_ipv6():
    """An IPv6 node IP was advertised bare ("fd00::5:7000"), an address no Target could dial."""
    assert advertised_address("0.0.0.0", 7000, lambda: "10.0.0.5") == "10.0.0.5:7000"
    assert advertised_address("::", 7000, lambda: "fd00::5") == "[fd00::5]:7000"
    assert advertised_address("[::]", 7000, lambda: "fd00::5") == "[fd00::5]:7000"
    assert advertised_address("127.0.0.1", 7001, lambda: "unused") == "127.0.0.1:7001"
    assert advertised_address("::1", 7002, lambda: "unused") == "[::1]:7002"


def test_the_bracketed_ipv6_address_is_one_grpc_dials():
    """gRPC dials the advertised form: a server on the IPv6 loopback answers a channel to "[::1]:port"."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        port = server.add_insecure_port("[::1]:0")
    except RuntimeError:  # no IPv6 loopback on this host
        port = 0
    if not port:
        pytest.skip("no IPv6 loopback on this host")
    server.start()
    try:
        ch = grpc.insecure_channel(advertised_address("::1", port, lambda: "unused"))
        grpc.channel_ready_future(ch).result(timeout=5)
        ch.close()
    finally:
        server.stop(0)
