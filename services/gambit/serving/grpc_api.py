"""Import paths for ``grpc_servicer_functions`` (Ray Serve's gRPC proxy) and plain servers.

Ray Serve imports these by name inside its proxy; each makes sure the generated modules exist
first. ``add_health_servicer`` registers the standard ``grpc.health.v1.Health`` service as a
passthrough service, so the proxy answers health checks itself (reflection is Ray's own option).
"""

from __future__ import annotations


def add_ReasoningServiceServicer_to_server(servicer, server) -> None:  # noqa: N802 — gRPC's naming
    from gambit.serving.protos import load

    load("reasoning")[1].add_ReasoningServiceServicer_to_server(servicer, server)


def add_ScorerServiceServicer_to_server(servicer, server) -> None:  # noqa: N802
    from gambit.serving.protos import load

    load("scorer")[1].add_ScorerServiceServicer_to_server(servicer, server)


def add_health_servicer(servicer, server) -> None:
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    if hasattr(server, "add_passthrough_service"):  # Ray Serve's proxy: serve it there, not in a replica
        server.add_passthrough_service(health.SERVICE_NAME)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    for name in ("", "gambit.v1.ReasoningService", "gambit.v1.ScorerService"):
        hs._server_status[name] = health_pb2.HealthCheckResponse.SERVING  # set() is a coroutine in aio


SERVICER_FUNCTIONS = [
    "gambit.serving.grpc_api.add_ReasoningServiceServicer_to_server",
    "gambit.serving.grpc_api.add_ScorerServiceServicer_to_server",
    "gambit.serving.grpc_api.add_health_servicer",
]
