"""Health and reflection on every gRPC server; a request that does not parse → INVALID_ARGUMENT naming
the field."""

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


class Undecodable:
    """What a request that protobuf cannot parse becomes, so its handler refuses it by name. Picklable
    (Ray Serve's proxy hands it to the Coordinator as it would the request), and reading any of its
    fields there raises ValueError with the reason: the Coordinator's INVALID_ARGUMENT."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "why":  # pickle's probes; ``why`` not set yet while unpickling
            raise AttributeError(name)
        raise ValueError(self.why)


def lenient(parse):
    """``parse`` (a generated ``Message.FromString``) that gives an ``Undecodable`` where it raised."""
    cls = getattr(parse, "__self__", None)
    if not hasattr(cls, "DESCRIPTOR"):
        return parse

    def deserialize(raw: bytes):
        try:
            return parse(raw)
        except Exception:  # noqa: BLE001 — protobuf's DecodeError, or upb's own
            return Undecodable(undecodable_message(cls, raw))

    return deserialize


def _twin(cls):
    """``cls`` with every string field read as bytes (cached): it parses what ``cls`` refuses."""
    twin = _TWINS.get(cls)
    if twin is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        fdp = descriptor_pb2.FileDescriptorProto()
        cls.DESCRIPTOR.file.CopyToProto(fdp)
        todo = list(fdp.message_type)
        while todo:
            m = todo.pop()
            todo.extend(m.nested_type)
            for f in m.field:
                if f.type == f.TYPE_STRING:
                    f.type = f.TYPE_BYTES
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        desc = pool.FindMessageTypeByName(cls.DESCRIPTOR.full_name)
        twin = _TWINS[cls] = message_factory.GetMessageClass(desc)
    return twin


_TWINS: dict = {}


def _not_text(desc, msg, path: str = "") -> str:
    """The first string field of ``msg`` (a twin) that is not UTF-8, as ``forks[2].parent: …``."""
    for f, value in msg.ListFields():
        real = desc.fields_by_name[f.name]
        repeated = f.is_repeated
        for i, v in enumerate(value if repeated else [value]):
            name = f"{path}{f.name}[{i}]" if repeated else f"{path}{f.name}"
            if real.type == real.TYPE_STRING:
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError as e:
                    return f"{name}: not UTF-8 text (byte {v[e.start]:#04x} at {e.start})"
            elif real.type == real.TYPE_MESSAGE:
                said = _not_text(real.message_type, v, name + ".")
                if said:
                    return said
    return ""


def undecodable_message(cls, raw: bytes) -> str:
    """Why ``raw`` is no ``cls``: the field that is not UTF-8 text, or the message that does not parse."""
    try:
        said = _not_text(cls.DESCRIPTOR, _twin(cls).FromString(raw))
    except Exception:  # noqa: BLE001 — truncated or not protobuf at all
        said = ""
    return said or f"request: not a valid {cls.DESCRIPTOR.full_name} message ({len(raw)} bytes)"


class DecodeErrorInterceptor(grpc.ServerInterceptor):
    """A request protobuf cannot parse (a string field that is not UTF-8, bytes that are no message) is
    INVALID_ARGUMENT naming the field: gRPC itself answered INTERNAL "Exception deserializing request!",
    which says neither what was wrong nor that the client, not the server, must change."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        parse = lenient(handler.request_deserializer)
        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request, context):
                if isinstance(request, Undecodable):
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)
                return inner(request, context)

            return handler._replace(request_deserializer=parse, unary_unary=unary)
        inner_stream = handler.unary_stream

        def stream(request, context):
            if isinstance(request, Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)
            yield from inner_stream(request, context)

        return handler._replace(request_deserializer=parse, unary_stream=stream)
