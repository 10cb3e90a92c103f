"""The generated protobuf and gRPC modules of proto/replayd/v1 (`replayd.v1`), and the
messages of the gRPC health check (proto/grpc/health/v1/health.proto).

The replayd modules are generated at build time (`cmake --build build --target
replayd_python`) into build/client/python/replayd/v1, which is where this package is
assembled. The health check's two messages are declared here instead, in a descriptor pool
of this module's own: Debian's python3-grpcio comes without grpc_health, and a pool of our
own cannot clash with it where it is installed.
"""

from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

try:
    from .v1 import replayd_pb2 as pb
    from .v1 import replayd_pb2_grpc as rpc
except ImportError as e:  # pragma: no cover - depends on how the package was set up
    raise ImportError(
        "replayd: the generated modules replayd.v1.replayd_pb2 and replayd_pb2_grpc are missing "
        f"({e}); build them with `cmake --build build --target replayd_python` and put "
        "build/client/python on PYTHONPATH") from e

__all__ = ["pb", "rpc", "health"]


def _health_messages() -> SimpleNamespace:
    """HealthCheckRequest and HealthCheckResponse as health.proto declares them, and the
    Check method's path."""
    Field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto",
                                              package="grpc.health.v1", syntax="proto3")
    request = file.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL)
    response = file.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=Field.TYPE_ENUM, label=Field.LABEL_OPTIONAL,
                       type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)

    def message_class(name: str):
        descriptor = pool.FindMessageTypeByName(f"grpc.health.v1.{name}")
        if hasattr(message_factory, "GetMessageClass"):  # protobuf 4.22 and later
            return message_factory.GetMessageClass(descriptor)
        return message_factory.MessageFactory(pool).GetPrototype(descriptor)

    return SimpleNamespace(HealthCheckRequest=message_class("HealthCheckRequest"),
                           HealthCheckResponse=message_class("HealthCheckResponse"),
                           CHECK="/grpc.health.v1.Health/Check")


health = _health_messages()
