"""Health and reflection on every gRPC server; ValueError → INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import grpc


def add_health_and_reflection(server: grpc.Server, full_service_names: list[str]):
    """Standard ``grpc.health.v1.Health`` (SERVING for "" and each service) and server reflection.

    Imported here, not at module level: the CLI and the benches import this module's neighbours, and
    a machine without the serving extras (a GPU box running `gambit bench`) must still build the CLI."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    for name in ["", *full_service_names]:
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*full_service_names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                        server)
    return hs
