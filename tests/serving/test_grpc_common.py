"""A request protobuf cannot parse is INVALID_ARGUMENT naming the field, over real gRPC (stop 70): gRPC
answered INTERNAL "Exception deserializing request!", naming nothing."""

import grpc
import pytest
import torch

from gambit.scoring import random_scorer
from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server

H = 16
pb2, _ = load("scorer")
rpb2, _ = load("reasoning")


@pytest.fixture(scope="module")
def server():
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, batch_wait_ms=1),
                              scorer=random_scorer("sequence", H, seed=3))
    yield srv
    srv.stop()


def raw_score(srv, raw: bytes, metadata=()):
    """Score with ``raw`` as the request's bytes, as a client in another language may send them."""
    with grpc.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
        call = ch.unary_unary("/gambit.v1.ScorerService/Score")  # no serializers: bytes as they are
        return pb2.ScoreResponse.FromString(call(raw, metadata=metadata, timeout=10))


def good() -> bytes:
    raw, dtype, shape = encode_states(torch.zeros(2, H))
    return pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=["run:1", "run:2"],
                            forks=[pb2.Fork(parent="run:0", child="run:1")]).SerializeToString()


@pytest.mark.parametrize("old, new, said", [
    (b"run:2", b"run:\xff", "trace_ids[1]: not UTF-8 text (byte 0xff at 4)"),
    (b"run:0", b"ru\xc3(0", "forks[0].parent: not UTF-8 text (byte 0xc3 at 2)"),
])
def test_a_string_field_that_is_not_utf8_is_invalid_argument_naming_it(server, old, new, said):
    assert len(raw_score(server, good()).scores) == 2  # the same bytes, UTF-8: scored
    with pytest.raises(grpc.RpcError) as e:
        raw_score(server, good().replace(old, new))
    assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, said)


def test_bytes_that_are_no_message_are_invalid_argument(server):
    for raw in (b"\xff\xff\xff\xff", good()[:-3]):
        with pytest.raises(grpc.RpcError) as e:
            raw_score(server, raw)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("request: not a valid gambit.v1.ScoreRequest message")
    assert len(raw_score(server, good()).scores) == 2  # and the server goes on


def test_the_token_is_still_checked_first(monkeypatch):
    monkeypatch.setenv("GAMBIT_TEST_TOKEN_GC", "s3cret")
    srv = start_scorer_server(ScorerServerConfig(port=0, metrics_port=-1, token_env="GAMBIT_TEST_TOKEN_GC"),
                              scorer=random_scorer("mlp", H, seed=3))
    try:
        with pytest.raises(grpc.RpcError) as e:
            raw_score(srv, b"\xff\xff")
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            raw_score(srv, b"\xff\xff", metadata=(("authorization", "Bearer s3cret"),))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        srv.stop()


def test_a_solve_request_names_its_field_too():
    from gambit.serving.grpc_common import undecodable_message

    raw = rpb2.SolveRequest(problem="Compute 1+1.", run_id="order-17").SerializeToString()
    assert undecodable_message(rpb2.SolveRequest, raw.replace(b"1+1", b"1\xfe1")) == \
        "problem: not UTF-8 text (byte 0xfe at 9)"
    assert undecodable_message(rpb2.SolveRequest, raw.replace(b"-17", b"\x80ab")) == \
        "run_id: not UTF-8 text (byte 0x80 at 5)"
