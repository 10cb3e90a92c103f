"""Sessions placed across many daemons, one per node, for clients that outgrow one machine:
`Daemons`, as the C++ client's replayd::client::Daemons (client/placement.h).

    daemons = replayd.Daemons(["dns:///replayd.jobs.svc:7070"], token=token)
    with daemons.session("cuda") as s:      # s.target, s.device: where it was placed
        ...

The daemons are given as a list of addresses, or as a name that resolves to many (a
Kubernetes headless Service lists every ready pod's address). Each session is opened on the
daemon with the most free memory on a device of the kind asked for, and keeps its calls on
that daemon for its life. A daemon that is draining (health NOT_SERVING), does not answer
within the probe timeout or whose name does not resolve is skipped.

Thread safety: a Daemons may be shared between threads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import socket
import threading
from typing import Dict, List, Optional, Tuple, Union

import grpc

from . import errors
from .client import TLS, TRANSPORTS, Client, Device
from .session import Session

__all__ = ["Daemons", "DaemonState", "PROBE_TIMEOUT", "resolve_target"]

# Seconds each daemon's health check and device list may take at a placement.
PROBE_TIMEOUT = 2.0

# The health service a daemon that takes sessions says SERVING for.
_REPLAYD_SERVICE = "replayd.v1.Replayd"

# Refusals of a session that send it to the next best daemon: it began draining since the
# survey, the tenant's quota there is full, or it did not answer in time.
_PASSED_OVER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DEADLINE_EXCEEDED)

# A survey in which every daemon answered with one of these refused this client's
# credentials: that is the answer, not unavailability.
_CREDENTIALS_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@dataclasses.dataclass(frozen=True)
class DaemonState:
    """One daemon as a placement found it: `target` is its address ("10.0.0.7:7070",
    "[fd00::7]:7070"), or the target as given when that did not resolve; `error` is None
    when it takes sessions, else why it was skipped (Unavailable "draining", NotFound for
    a name that does not resolve, or the error of its health check or device list);
    `devices` its ListDevices (empty unless `error` is None)."""

    target: str
    error: Optional[errors.Error]
    devices: Tuple[Device, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def _split_host_port(target: str) -> Tuple[str, str]:
    """The host and port of "host:port", "[v6 address]:port" or "dns:///host:port";
    InvalidArgument naming the target and what is wrong with it."""
    def refuse(why: str) -> errors.InvalidArgument:
        return errors.InvalidArgument(f'daemon target "{target}": {why}')

    rest = target
    for prefix in ("dns:///", "dns:"):
        if rest.startswith(prefix):
            rest = rest[len(prefix):]
            break
    if rest.startswith("["):
        host, bracket, port = rest[1:].partition("]")
        if not bracket:
            raise refuse("no ']' after an IPv6 address")
        if not port.startswith(":"):
            raise refuse("no port (host:port)")
        port = port[1:]
    else:
        host, colon, port = rest.rpartition(":")
        if not colon:
            raise refuse("no port (host:port)")
        if ":" in host:
            raise refuse("an IPv6 address goes in brackets: [address]:port")
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise refuse("the port is not 1 to 65535")
    if not host:
        raise refuse("no host")
    return host, port


def _address_target(host: str, port: str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve_target(target: str) -> List[str]:
    """`target` split into one target per address its host resolves to ("localhost:7070"
    -> ["127.0.0.1:7070", "[::1]:7070"]); a numeric address or a "unix:" target as it is.
    InvalidArgument without a port; NotFound when the name does not resolve."""
    if target.startswith("unix:"):
        return [target]
    host, port = _split_host_port(target)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise errors.NotFound(f'daemon target "{target}": {e.strerror}') from None
    targets: List[str] = []
    for family, _, _, _, address in found:
        if family in (socket.AF_INET, socket.AF_INET6):
            one = _address_target(address[0], port)
            if one not in targets:
                targets.append(one)
    if not targets:
        raise errors.NotFound(f'daemon target "{target}": no address')
    return targets


@dataclasses.dataclass(frozen=True)
class _Address:
    """A resolved daemon: its address, and the host name its certificate is checked
    against ("" for a "unix:" target)."""

    target: str
    host: str


class Daemons:
    """Many daemons that sessions are placed on. Use as a context manager, or call
    `close()`, which closes every session opened through it."""

    def __init__(self, targets: Union[str, List[str], Tuple[str, ...]], token: Optional[str] = None,
                 tls: Union[None, bool, TLS] = None, window: int = 64, transport: str = "auto",
                 probe_timeout: float = PROBE_TIMEOUT) -> None:
        """The daemons at `targets`: one target or a list of them, each "host:port",
        "[v6 address]:port" or "dns:///host:port". A host name stands for every address it
        resolves to, resolved again at each placement (so pods that come and go are
        followed); a "unix:" target is used as it is. `token`, `tls`, `window` and
        `transport` are `connect`'s, the same for every daemon; with TLS each daemon's
        certificate is checked against the host name given (or `tls.server_name`).
        `probe_timeout`: seconds each daemon's health check and device list may take at a
        placement; a daemon slower than this is skipped. InvalidArgument for no targets,
        a target without a port, or a probe timeout that is not a positive number."""
        if isinstance(targets, str):
            targets = [targets]
        elif not isinstance(targets, (list, tuple)):
            raise errors.InvalidArgument(f"daemon targets {targets!r}: a list of \"host:port\" or one")
        if not targets:
            raise errors.InvalidArgument("no daemon targets")
        for target in targets:
            if not isinstance(target, str):
                raise errors.InvalidArgument(f"daemon target {target!r}: not a str (\"host:port\")")
            if not target.startswith("unix:"):
                _split_host_port(target)
        if isinstance(probe_timeout, bool) or not isinstance(probe_timeout, (int, float)) or not probe_timeout > 0:
            raise errors.InvalidArgument(f"probe timeout {probe_timeout!r}: not a positive number of seconds")
        if transport not in TRANSPORTS:
            raise errors.InvalidArgument(f"transport {transport!r}: auto, native, direct or threaded")
        self.targets: Tuple[str, ...] = tuple(targets)
        self.probe_timeout = float(probe_timeout)
        self._token = token if token is not None else os.environ.get("REPLAYD_TOKEN") or None
        self._tls = (tls if isinstance(tls, TLS) else TLS()) if tls else None
        self._window = window
        self._transport = transport
        self._lock = threading.Lock()
        self._clients: Dict[str, Client] = {}  # by resolved target; their channels kept
        self._turn = 0  # where ties start, one further each placement
        self._closed = False

    def survey(self) -> List[DaemonState]:
        """Resolves the targets and asks every daemon, in parallel, for its health and
        devices: a state for each address, then one for each target that does not resolve.
        NotFound when no target resolves to any address."""
        addresses, unresolved = self._resolve()
        if not addresses:
            why = "; ".join(d.error.message for d in unresolved)
            raise errors.NotFound(f"no daemon target resolves: {why}")
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(addresses)) as pool:
            probed = list(pool.map(self._probe, addresses))
        return probed + unresolved

    def session(self, kind: str) -> Session:
        """Opens a session on a device of `kind` ("cpu", "cuda", "hip"): of the daemons that
        are serving, on the device with the most free memory (ties go round the daemons in
        turn). If that daemon refuses the session as Unavailable or ResourceExhausted (it
        began draining, or the tenant's quota there is full), the next best is tried. The
        session's `target` and `device` say where it was placed (the device as listed then).

        Unavailable, naming each daemon and why, when no serving daemon has such a device
        or all refused; any other refusal of the session is raised as it is, prefixed with
        the daemon's address, and so is Unauthenticated or PermissionDenied when every
        daemon answered the survey with it. NotFound when no target resolves."""
        if not isinstance(kind, str) or not kind:
            raise errors.InvalidArgument(f"device kind {kind!r}: a kind such as \"cpu\" or \"cuda\"")
        if ":" in kind:
            raise errors.InvalidArgument(f"device kind {kind!r}: a kind (\"{kind.split(':')[0]}\"), "
                                         "not a device id; a device of one daemon is its Client's session()")
        survey = self.survey()
        with self._lock:
            turn, self._turn = self._turn, self._turn + 1
        candidates: List[Tuple[int, Device]] = []  # (index in the survey, device)
        why: List[str] = []  # each daemon that cannot take the session, and why
        for i, d in enumerate(survey):
            if d.error is not None:
                why.append(f"{d.target}: {d.error}")
                continue
            mine = [(i, device) for device in d.devices if device.kind == kind]
            if not mine:
                why.append(f"{d.target}: no {kind} device")
            candidates += mine
        if not candidates and all(d.error is not None and d.error.code in _CREDENTIALS_REFUSED for d in survey):
            raise errors.from_status(survey[0].error.code,
                                     f"no daemon takes this client's sessions: {'; '.join(why)}")
        n = len(survey)
        candidates.sort(key=lambda c: (-c[1].free_memory, (c[0] - turn) % n))
        refused = set()  # daemons that refused a session: their other devices are not tried
        for i, device in candidates:
            if i in refused:
                continue
            target = survey[i].target
            try:
                session = self.client_of(target).session(device.id)
            except errors.Error as e:
                if e.code not in _PASSED_OVER:
                    raise errors.from_status(e.code, f"{target}: {e.message}") from None
                why.append(f"{target}: {e}")
                refused.add(i)
                continue
            session._device = device  # as listed when it was placed
            return session
        raise errors.Unavailable(f"no daemon takes a session on a {kind} device: {'; '.join(why)}")

    def client_of(self, target: str) -> Client:
        """The client of one daemon of a survey (a resolved address, as `DaemonState.target`
        has it), sharing this set's connection. NotFound for a daemon no survey found."""
        with self._lock:
            self._check_open()
            client = self._clients.get(target)
        if client is None:
            raise errors.NotFound(f'no daemon "{target}" in this set\'s surveys')
        return client

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes every daemon's client, and with them the sessions opened through this set
        (best effort, as `Client.close`). Later calls raise Unavailable. Idempotent."""
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self) -> "Daemons":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise errors.Unavailable(f"the daemons {', '.join(self.targets)} are closed")

    def _resolve(self) -> Tuple[List[_Address], List[DaemonState]]:
        """Every target's addresses, each once, and a state for each target that does not
        resolve."""
        addresses: List[_Address] = []
        unresolved: List[DaemonState] = []
        for target in self.targets:
            try:
                resolved = resolve_target(target)
            except errors.NotFound as e:
                unresolved.append(DaemonState(target, e))
                continue
            host = "" if target.startswith("unix:") else _split_host_port(target)[0]
            addresses += [_Address(one, host) for one in resolved
                          if all(a.target != one for a in addresses)]
        return addresses, unresolved

    def _client_for(self, address: _Address) -> Client:
        with self._lock:
            self._check_open()
            client = self._clients.get(address.target)
            if client is None:
                tls = self._tls
                if tls is not None and not tls.server_name and address.host:
                    tls = dataclasses.replace(tls, server_name=address.host)
                # "" rather than None: $REPLAYD_TOKEN was looked up once, by __init__.
                client = Client(address.target, token=self._token or "", tls=tls, window=self._window,
                                transport=self._transport)
                self._clients[address.target] = client
            return client

    def _probe(self, address: _Address) -> DaemonState:
        client = self._client_for(address)
        try:
            health = client.health(_REPLAYD_SERVICE, timeout=self.probe_timeout)
            if health != "SERVING":
                why = "draining" if health == "NOT_SERVING" else health.lower().replace("_", " ")
                return DaemonState(address.target, errors.Unavailable(why))
            return DaemonState(address.target, None, tuple(client.devices(timeout=self.probe_timeout)))
        except errors.Error as e:
            return DaemonState(address.target, e)
