"""The generated protobuf and gRPC modules of proto/replayd/v1 (`replayd.v1`).

They are generated at build time (`cmake --build build --target replayd_python`) into
build/client/python/replayd/v1, which is where this package is assembled.
"""

try:
    from .v1 import replayd_pb2 as pb
    from .v1 import replayd_pb2_grpc as rpc
except ImportError as e:  # pragma: no cover - depends on how the package was set up
    raise ImportError(
        "replayd: the generated modules replayd.v1.replayd_pb2 and replayd_pb2_grpc are missing "
        f"({e}); build them with `cmake --build build --target replayd_python` and put "
        "build/client/python on PYTHONPATH") from e

__all__ = ["pb", "rpc"]
