"""Import paths for ``grpc_servicer_functions`` (Ray Serve's gRPC proxy) and plain servers.

Ray Serve imports these by name inside its proxy; each makes sure the generated modules exist
first. ``add_health_servicer`` registers the standard ``grpc.health.v1.Health`` service as a
passthrough service, so the proxy answers health checks itself (reflection is Ray's own option).
"""

from __future__ import annotations


class _LenientServer:
    """``server`` as the generated ``add_*_to_server`` sees it: each method's request deserializer is
    ``grpc_common.lenient``, so a request that does not parse (a string that is not UTF-8) reaches the
    servicer as an ``Undecodable``, which the Coordinator answers INVALID_ARGUMENT naming the field; Ray
    Serve's proxy, which keeps the deserializers, answered INTERNAL "Exception deserializing request!"."""

    def __init__(self, server) -> None:
        self._server = server

    @staticmethod
    def _lenient(handlers: dict) -> dict:
        from gambit.serving.grpc_common import lenient

        return {k: h._replace(request_deserializer=lenient(h.request_deserializer))
                if h.request_deserializer is not None and not h.request_streaming else h
                for k, h in handlers.items()}

    def add_generic_rpc_handlers(self, generic_rpc_handlers) -> None:
        for h in generic_rpc_handlers:
            if isinstance(getattr(h, "_method_handlers", None), dict):  # grpc.method_handlers_generic_handler
                h._method_handlers = self._lenient(h._method_handlers)
        self._server.add_generic_rpc_handlers(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self._server.add_registered_method_handlers(service_name, self._lenient(method_handlers))

    def __getattr__(self, name: str):
        return getattr(self._server, name)


def add_ReasoningServiceServicer_to_server(servicer, server) -> None:  # noqa: N802 — gRPC's naming
    from gambit.serving.protos import load

    load("reasoning")[1].add_ReasoningServiceServicer_to_server(servicer, _LenientServer(server))


def add_ScorerServiceServicer_to_server(servicer, server) -> None:  # noqa: N802
    from gambit.serving.protos import load

    load("scorer")[1].add_ScorerServiceServicer_to_server(servicer, _LenientServer(server))


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
