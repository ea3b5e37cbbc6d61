"""The servicer functions Ray Serve's proxy imports: a SolveRequest that does not parse reaches the
servicer as a value whose field reads raise ValueError naming the field (the Coordinator's
INVALID_ARGUMENT), through the pickle hop to the replica; the proxy answered INTERNAL (stop 70)."""

import pickle
from concurrent import futures

import grpc
import pytest

from gambit.serving.grpc_api import add_ReasoningServiceServicer_to_server
from gambit.serving.protos import load
from gambit.serving.solve_config import check_run_id, from_request

pb2, pb2_grpc = load("reasoning")


class CoordinatorLike:
    """What the Coordinator does with a request: Ray pickles it to the replica, ``from_request`` or
    ``check_run_id`` reads it, a ValueError is INVALID_ARGUMENT with its text."""

    def Solve(self, request, context):  # noqa: N802
        try:
            problem, _ = from_request(pickle.loads(pickle.dumps(request)))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        yield pb2.SolveEvent(started=pb2.RunStarted(run_id="r1", replica=problem))

    def GetRun(self, request, context):  # noqa: N802
        try:
            return pb2.RunInfo(run_id=check_run_id(pickle.loads(pickle.dumps(request)).run_id))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    CancelRun = GetRun  # noqa: N815


@pytest.fixture(scope="module")
def address():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    add_ReasoningServiceServicer_to_server(CoordinatorLike(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_a_problem_that_is_not_utf8_is_invalid_argument_naming_it(address):
    raw = pb2.SolveRequest(problem="Compute 1+1.").SerializeToString()
    with grpc.insecure_channel(address) as ch:
        solve = ch.unary_stream("/gambit.v1.ReasoningService/Solve",
                                response_deserializer=pb2.SolveEvent.FromString)
        assert [e.started.replica for e in solve(raw, timeout=10)] == ["Compute 1+1."]  # UTF-8: served
        with pytest.raises(grpc.RpcError) as e:
            list(solve(raw.replace(b"1+1", b"1\xfe1"), timeout=10))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "problem: not UTF-8 text (byte 0xfe at 9)"
        get = ch.unary_unary("/gambit.v1.ReasoningService/GetRun",
                             response_deserializer=pb2.RunInfo.FromString)
        assert get(pb2.GetRunRequest(run_id="order-17").SerializeToString(), timeout=10).run_id == "order-17"
        for raw, said in ((b"\x0a\x07order-\xff", "run_id: not UTF-8 text (byte 0xff at 6)"),
                          (b"\x0a\x05ab", "request: not a valid gambit.v1.GetRunRequest message (4 bytes)")):
            with pytest.raises(grpc.RpcError) as e:
                get(raw, timeout=10)
            assert (e.value.code(), e.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, said)
