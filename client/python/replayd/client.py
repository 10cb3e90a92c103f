"""Connecting to a daemon: `connect`, `Client`, the devices it serves."""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import grpc

from . import errors
from ._stubs import health, pb, rpc

__all__ = ["Client", "Device", "LaunchLimits", "TLS", "connect"]

# As the C++ client: messages carry at most 1 MiB of data (a chunk, a replay's reads) plus
# their framing; the limit leaves room for both.
_MAX_MESSAGE_BYTES = 20 << 20

PemSource = Union[bytes, str, Path]

# How a session's stream is carried (replayd.stream); see `connect`.
TRANSPORTS = ("auto", "native", "direct", "threaded")


def _pem(source: Optional[PemSource]) -> Optional[bytes]:
    """PEM bytes, or the contents of the file a str or Path names."""
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


@dataclasses.dataclass(frozen=True)
class TLS:
    """TLS to the daemon: `root_ca` is the CA that signed its certificate (PEM bytes or a
    file; None: the system's roots); `cert` and `key` this client's for mutual TLS;
    `server_name` the name its certificate is checked against (default: the target's host)."""

    root_ca: Optional[PemSource] = None
    cert: Optional[PemSource] = None
    key: Optional[PemSource] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.root_ca), private_key=_pem(self.key),
            certificate_chain=_pem(self.cert))


@dataclasses.dataclass(frozen=True)
class LaunchLimits:
    """Largest global and local sizes per dimension and of their products; most arguments."""

    max_global: Tuple[int, ...]
    max_global_total: int
    max_local: Tuple[int, ...]
    max_local_total: int
    max_args: int


@dataclasses.dataclass(frozen=True)
class Device:
    """A device the daemon owns: `id` ("cpu:0", "cuda:0"), its memory in bytes, the program
    formats it accepts and what programs are compiled for (`architecture`)."""

    id: str
    kind: str
    name: str
    total_memory: int
    free_memory: int
    formats: Tuple[str, ...]
    architecture: str
    driver_version: str
    limits: LaunchLimits

    @classmethod
    def from_proto(cls, d: pb.Device) -> "Device":
        lim = d.limits
        return cls(id=d.id, kind=d.kind, name=d.name, total_memory=d.total_memory,
                   free_memory=d.free_memory, formats=tuple(d.formats),
                   architecture=d.architecture, driver_version=d.driver_version,
                   limits=LaunchLimits(tuple(lim.max_global), lim.max_global_total,
                                       tuple(lim.max_local), lim.max_local_total, lim.max_args))

    @property
    def source_format(self) -> str:
        """The format a program's source text is loaded as by default: the device's source
        format ("cpu-c", "cuda-c", "hip-c"), else its first."""
        for f in self.formats:
            if f.endswith("-c"):
                return f
        if not self.formats:
            raise errors.FailedPrecondition(f"device {self.id} accepts no program format")
        return self.formats[0]


class Client:
    """A connection to one daemon. Thread-safe: sessions may be opened and used from many
    threads. Use as a context manager, or call `close()`."""

    def __init__(self, target: str, token: Optional[str] = None, tls: Union[None, bool, TLS] = None,
                 window: int = 64, transport: str = "auto",
                 options: Sequence[Tuple[str, object]] = ()) -> None:
        """A client of the daemon at `target` ("127.0.0.1:7070"); see `connect`.
        `options` are extra gRPC channel arguments."""
        if transport not in TRANSPORTS:
            raise errors.InvalidArgument(f"transport {transport!r}: auto, native, direct or threaded")
        if token is None:
            token = os.environ.get("REPLAYD_TOKEN") or None
        channel_options = [("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
                           ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                           *options]
        self._tls: Optional[TLS] = (tls if isinstance(tls, TLS) else TLS()) if tls else None
        self._channel_options = channel_options[:]
        self._native: Optional[object] = None  # the native transport's channel, made on first use
        self._native_lock = threading.Lock()
        if tls:
            tls = self._tls
            if tls.server_name:
                channel_options.append(("grpc.ssl_target_name_override", tls.server_name))
            credentials = tls.credentials()
            self._channel = grpc.secure_channel(target, credentials, options=channel_options)
        else:
            self._channel = grpc.insecure_channel(target, options=channel_options)
        self.target = target
        self.window = window
        self.transport = transport
        self._stub = rpc.ReplaydStub(self._channel)
        self._health_check = self._channel.unary_unary(
            health.CHECK, request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=health.HealthCheckResponse.FromString)
        self._metadata: Optional[Tuple[Tuple[str, str], ...]] = (
            (("authorization", f"Bearer {token}"),) if token else None)
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()
        self._closed = False

    def devices(self, timeout: Optional[float] = None) -> List[Device]:
        """The devices the daemon owns, with their current free memory. `timeout`: seconds
        the call may take (DeadlineExceeded past it); None waits as long as it takes."""
        reply = self._unary(self._stub.ListDevices, pb.ListDevicesRequest(), timeout)
        return [Device.from_proto(d) for d in reply.devices]

    def health(self, service: str = "replayd.v1.Replayd", timeout: Optional[float] = None) -> str:
        """The daemon's gRPC health for `service`: "SERVING", or "NOT_SERVING" (for
        replayd.v1.Replayd: the daemon is draining, or serves no device). "" asks about
        the server as a whole, "replayd.v1.Admin" whether the process runs. NotFound for a
        service the daemon does not know."""
        reply = self._unary(self._health_check, health.HealthCheckRequest(service=service), timeout)
        return health.HealthCheckResponse.ServingStatus.Name(reply.status)

    def device(self, device_id: str) -> Device:
        """One device by id; NotFound when the daemon does not serve it."""
        for d in self.devices():
            if d.id == device_id:
                return d
        raise errors.NotFound(f"device {device_id!r} is not served by {self.target}")

    def session(self, device: str = "cpu:0") -> "Session":
        """Opens a session on `device`. Use it as a context manager (`with
        client.session("cuda:0") as s:`): it closes on exit, freeing everything it owns."""
        from .session import Session  # the session module imports this one
        reply = self._unary(self._stub.OpenSession, pb.OpenSessionRequest(device=device))
        s = Session(self, device, reply)
        self._sessions.add(s)
        return s

    def _native_channel(self) -> object:
        """The native transport's channel (replayd._transport.Channel) to the daemon: its
        own connection, with this client's TLS and channel options, made on first use."""
        with self._native_lock:
            if self._native is None:
                from . import _transport
                tls = self._tls
                options = tuple((k, v) for k, v in self._channel_options if isinstance(v, (int, str)))
                if tls is None:
                    self._native = _transport.Channel(self.target, options=options)
                else:
                    self._native = _transport.Channel(
                        self.target, tls=True, root_ca=_pem(tls.root_ca), cert=_pem(tls.cert), key=_pem(tls.key),
                        server_name=tls.server_name, options=options)
            return self._native

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes the sessions still open (best effort: one the daemon cannot be told of
        expires by its lease), then the connection. Later calls raise Unavailable."""
        if self._closed:
            return
        for s in list(self._sessions):
            try:
                s.close()
            except errors.Error:
                pass
        self._closed = True
        self._channel.close()
        self._native = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method, request, timeout: Optional[float] = None):
        if self._closed:
            raise errors.Unavailable(f"the client of {self.target} is closed")
        try:
            return method(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None


def connect(target: str = "127.0.0.1:7070", token: Optional[str] = None,
            tls: Union[None, bool, TLS] = None, window: int = 64, transport: str = "auto") -> Client:
    """A client of the daemon at `target`; the connection is made on the first call.

    `token`: the bearer token for a daemon with a tenants file (default: $REPLAYD_TOKEN).
    `tls`: None or False for plaintext, True for TLS with the system's roots, or a `TLS`
    with the daemon's CA (and this client's certificate and key for mutual TLS).
    `window`: operations a session's stream may have outstanding before `replay_async`
    first reads the oldest reply.
    `transport`: how sessions' streams are carried (replayd.stream): "native" (gRPC's C++
    library, driven by the calling thread; built with the package where Python's headers
    are), "direct" (grpcio's internal layer, driven by the calling thread), "threaded"
    (grpcio's public streaming API, two thread hops per round trip) or "auto" (the first of
    these available).
    """
    return Client(target, token=token, tls=tls, window=window, transport=transport)


from .session import Session  # noqa: E402  (for the annotations above)
