"""The client end of a session's Session stream: requests sent in order from any thread,
replies matched to them by sequence number.

As in the C++ client (client/stream.h), no thread reads on its own: a thread that needs a
reply reads it, and while one thread reads, the others wait for it to complete their
operations or to hand them the turn to read. At most `window` operations are outstanding;
past that, `submit` reads replies on the calling thread until one completes. After a reply
that failed, the next request sent carries `resume`, so each operation issued after an
error runs (the daemon answers the ones already queued behind it ABORTED).

Three transports carry the stream:
- `NativeTransport` drives the call through gRPC's C++ library (the package's `_transport`
  module, built with it where Python's headers are) from the thread that holds the read
  turn, on a completion queue of the call's own, with the GIL released while it waits:
  as the C++ client's stream, without grpcio's per-message cost. Its own connection to the
  daemon, beside the one grpcio keeps for the other calls.
- `DirectTransport` drives the gRPC call from the thread that holds the read turn, on a
  completion queue of the call's own (grpcio's single-threaded call, as its blocking unary
  calls use): a round trip costs no thread hop. It uses grpcio's internal `cygrpc` layer.
- `ThreadedTransport` uses grpcio's public streaming API, whose request iterator and
  replies pass through grpcio's threads: two thread hops per round trip (measured 2.5 to
  3 times the direct transport's round trip). The fallback when the internal layer is not
  what this module expects.

Thread safety: SessionStream is thread-safe; a transport is used under its stream's lock
(sending) and read turn (polling).
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple, Union

import grpc

from . import errors
from ._stubs import pb

_ABORTED = grpc.StatusCode.ABORTED.value[0]
# A ReplayRequest's kinds of parameter value: a buffer handle, an integer.
BUFFER_KIND, INTEGER_KIND = ord("b"), ord("i")
SESSION_METHOD = "/replayd.v1.Replayd/Session"

Metadata = Optional[Sequence[Tuple[str, str]]]


class Ended(Exception):
    """The stream has ended; `error` is why (Unavailable after a clean end)."""

    def __init__(self, error: errors.Error) -> None:
        super().__init__(str(error))
        self.error = error


class ThreadedTransport:
    """The stream through grpcio's public API (its threads send and receive)."""

    name = "threaded"
    _CLOSE = object()

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        method = channel.stream_stream(SESSION_METHOD, request_serializer=pb.SessionRequest.SerializeToString,
                                       response_deserializer=pb.SessionReply.FromString)
        self._call = method(iter(self._requests.get, self._CLOSE), metadata=metadata)

    def can_send(self) -> bool:
        return True

    def receive_armed(self) -> bool:
        return True  # grpcio's thread receives

    def arm_receive(self) -> None:
        pass

    def send(self, request: pb.SessionRequest, with_receive: bool = False) -> bool:
        if not self._call.is_active():
            return False
        self._requests.put(request)
        return True

    def poll(self, message_only: bool = False) -> Optional[pb.SessionReply]:
        try:
            return next(self._call)
        except StopIteration:
            raise Ended(errors.Unavailable("the session stream ended")) from None
        except grpc.RpcError as e:
            raise Ended(errors.from_rpc_error(e)) from None

    def close(self) -> None:
        self._requests.put(self._CLOSE)

    def cancel(self) -> None:
        self._requests.put(self._CLOSE)
        self._call.cancel()


class DirectTransport:
    """The stream as one gRPC call on a completion queue of its own, polled by whichever
    thread holds the stream's read turn.

    gRPC takes one message send and one receive at a time per call. A send waits for the
    previous one's completion, which the polling thread sees. A receive is kept armed while
    replies are due; a request sent when none is due (a round trip) goes in one batch with
    its reply's receive, which saves a batch and a completion per round trip."""

    name = "direct"

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        from grpc._cython import cygrpc  # grpcio's internal layer; ImportError selects the fallback
        self._cygrpc = cygrpc
        md = tuple(metadata) if metadata else None
        ops = (((cygrpc.SendInitialMetadataOperation(md, 0),), "metadata"),
               ((cygrpc.ReceiveInitialMetadataOperation(0),), "initial"),
               ((cygrpc.ReceiveStatusOnClientOperation(0),), "status"))
        self._call = channel._channel.segregated_call(  # type: ignore[attr-defined]
            cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, SESSION_METHOD.encode(), None, None, md, None,
            ops, cygrpc.build_census_context())
        self._outstanding = {"metadata", "initial", "status"}  # tags of the batches in flight
        self._sending = False
        self._receiving = False
        self._status: Optional[errors.Error] = None
        self._closed = False

    def can_send(self) -> bool:
        return not self._sending

    def receive_armed(self) -> bool:
        return self._receiving

    def arm_receive(self) -> None:
        if not self._receiving and self._status is None:
            self._receiving = self._operate((self._cygrpc.ReceiveMessageOperation(0),), "receive")

    def send(self, request: pb.SessionRequest, with_receive: bool = False) -> bool:
        if self._status is not None or self._closed:
            return False
        message = self._cygrpc.SendMessageOperation(request.SerializeToString(), 0)
        if with_receive and not self._receiving:
            if not self._operate((message, self._cygrpc.ReceiveMessageOperation(0)), "send+receive"):
                return False
            self._receiving = True
        elif not self._operate((message,), "send"):
            return False
        self._sending = True
        return True

    def poll(self, message_only: bool = False) -> Optional[pb.SessionReply]:
        if not self._outstanding:
            raise Ended(self._status or errors.Unavailable("the session stream ended"))
        event = self._call.next_event()
        tag = event.tag
        self._outstanding.discard(tag)
        reply = None
        if tag == "send" or tag == "send+receive":
            self._sending = False
        if tag == "receive" or tag == "send+receive":
            self._receiving = False
            data = event.batch_operations[-1].message()
            if data is not None:
                reply = pb.SessionReply.FromString(data)
        elif tag == "status":
            op = event.batch_operations[0]
            details = op.details()
            if isinstance(details, bytes):
                details = details.decode(errors="replace")
            self._status = (errors.Unavailable("the session stream ended") if op.code() == 0
                            else errors.from_number(op.code(), details or ""))
        if self._status is not None and not self._outstanding:
            raise Ended(self._status)  # every batch has completed: the call and its queue are gone
        return reply

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._operate((self._cygrpc.SendCloseFromClientOperation(0),), "close")
            self.arm_receive()  # for the end of the stream

    def cancel(self) -> None:
        self._closed = True
        self._call.cancel(self._cygrpc.StatusCode.cancelled, "cancelled by the client")

    def _operate(self, operations: Tuple[Any, ...], tag: str) -> bool:
        if not self._call.operate(operations, tag):
            return False
        self._outstanding.add(tag)
        return True


class NativeTransport:
    """The stream as one call of gRPC's C++ library (replayd._transport), polled by
    whichever thread holds the stream's read turn. As DirectTransport: one send and one
    receive outstanding at a time, a receive armed with the send of a round trip."""

    name = "native"

    def __init__(self, channel: Any, metadata: Metadata) -> None:
        from . import _transport
        self._ended = _transport.Ended
        self._call = channel.call(SESSION_METHOD, tuple(metadata) if metadata else None)
        self.can_send = self._call.can_send
        self.receive_armed = self._call.receive_armed
        self.arm_receive = self._call.arm_receive
        self.close = self._call.close
        self.cancel = self._call.cancel
        # A replay's round trip, encoded and decoded in C++ (SessionStream.replay).
        self.send_replay = self._call.send_replay

    def send(self, request: pb.SessionRequest, with_receive: bool = False) -> bool:
        return self._call.send(request.SerializeToString(), with_receive)

    def poll(self, message_only: bool = False) -> Optional[pb.SessionReply]:
        try:
            data = self._call.poll(message_only)
        except self._ended as end:
            raise self._end(end) from None
        return None if data is None else pb.SessionReply.FromString(data)

    def poll_replay(self, message_only: bool, outputs: Sequence[Any]) -> Any:
        """poll(), a message decoded as a replay's reply (a ReplayReply: seq, code,
        message, final, device_seconds), its reads copied into `outputs` when it
        succeeded."""
        try:
            return self._call.poll_replay(message_only, outputs)
        except self._ended as end:
            raise self._end(end) from None

    def receive_replay(self, outputs: Sequence[Any]) -> Tuple[int, int, str, bool, float]:
        """The next message, a replay's reply: (seq, code, message, final, device_seconds),
        its reads copied into `outputs` when it succeeded."""
        try:
            return self._call.receive_replay(outputs)
        except self._ended as end:
            raise self._end(end) from None

    @staticmethod
    def _end(end: Exception) -> Ended:
        code, details = end.args
        return Ended(errors.Unavailable("the session stream ended") if code == 0
                     else errors.from_number(code, details))


def native_available() -> bool:
    """Whether the native transport was built with the package."""
    try:
        from . import _transport  # noqa: F401
    except ImportError:
        return False
    return True


def open_transport(channel: grpc.Channel, metadata: Metadata, kind: str,
                   native_channel: Optional[Callable[[], Any]] = None) -> Any:
    """A transport of `kind`: "native", "direct", "threaded", or "auto" (the first of
    these available). `native_channel` makes the native transport's channel (a
    replayd._transport.Channel) on first use."""
    if kind == "threaded":
        return ThreadedTransport(channel, metadata)
    if kind == "direct":
        return DirectTransport(channel, metadata)
    if kind == "native" or (kind == "auto" and native_channel is not None and native_available()):
        if native_channel is None:
            raise errors.FailedPrecondition("the native transport needs its channel")
        return NativeTransport(native_channel(), metadata)
    try:
        return DirectTransport(channel, metadata)
    except (ImportError, AttributeError, TypeError):
        return ThreadedTransport(channel, metadata)


class ReplayRequest:
    """A replay to send on the stream: `graph`, its parameter vector `values` with `kinds`
    (b"b" a buffer handle, b"i" an integer, per value), `wait`, and `reads` as (buffer,
    offset, length). The native transport encodes it in C++; `proto()` is the same request
    as a protobuf message, for the others."""

    __slots__ = ("graph", "fields")

    def __init__(self, graph: int, values: Sequence[int], kinds: bytes, wait: bool,
                 reads: Sequence[Tuple[int, int, int]]) -> None:
        self.graph = graph
        self.fields = (graph, values, kinds, wait, reads)

    def proto(self) -> pb.SessionRequest:
        graph, values, kinds, wait, reads = self.fields
        req = pb.SessionRequest()
        r = req.replay
        r.graph = graph
        add_params(r.params, kinds, values)
        r.wait = wait
        add = r.reads.add
        for buffer, offset, length in reads:
            add(buffer=buffer, offset=offset, length=length)
        return req


def add_params(out: Any, kinds: bytes, values: Sequence[int]) -> None:
    """Appends a parameter vector (`values`, with their `kinds`) to `out`, a repeated
    ParamValue field."""
    add = out.add
    for kind, v in zip(kinds, values):
        if kind == BUFFER_KIND:
            add(buffer=v)
        else:
            add(int_value=v)


class NotSent(Exception):
    """The stream had ended before the request went out; a new stream may carry it."""


class Operation:
    """One request on the stream: its replies arrive through `partial` (the non-final ones
    of a replay sequence) and as `reply` or `error`, on whichever thread reads them."""

    __slots__ = ("seq", "reply", "error", "finished", "partial", "outputs")

    def __init__(self, partial: Optional[Callable[[pb.SessionReply], None]] = None,
                 outputs: Optional[List[Any]] = None) -> None:
        self.seq = 0
        self.reply: Any = None  # a SessionReply, or the transport's ReplayReply (below)
        self.error: Optional[errors.Error] = None
        self.finished = False
        self.partial = partial
        # A replay's: the arrays its reads are decoded into by a transport that decodes
        # replays itself (poll_replay); its reply is then that transport's ReplayReply.
        self.outputs = outputs

    def result(self) -> Any:
        """The final reply; raises the operation's error. Only once `finished`."""
        if self.error is not None:
            raise self.error
        assert self.reply is not None
        return self.reply


class SessionStream:
    """One Session stream of session `session` over `transport`."""

    def __init__(self, transport: Any, session: int, window: int) -> None:
        self.transport = transport
        # A transport that encodes and decodes replays itself (the native one) has these.
        self._send_replay = getattr(transport, "send_replay", None)
        self._poll_replay = getattr(transport, "poll_replay", None)
        self._session = session
        self._window = max(1, window)
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        self._pending: Deque[Operation] = collections.deque()
        self._next_seq = 1
        self._reading = False  # a thread holds the read turn
        self._waiting = 0  # threads waiting on _turn
        self._ended = False  # the daemon's side is gone: nothing more to read
        self._closing = False  # close() has begun: nothing more is sent
        self._resume_next = False

    @property
    def decodes_replays(self) -> bool:
        """Whether the transport encodes and decodes replays itself (`replay`)."""
        return self._send_replay is not None

    def healthy(self) -> bool:
        """False once the stream has ended or is closing; a new one must be opened."""
        with self._lock:
            return not (self._ended or self._closing)

    def submit(self, request: Union[pb.SessionRequest, "ReplayRequest"], op: Operation,
               awaited: bool = False) -> None:
        """Sends `request` (its seq, session and resume are set here) for `op`. `awaited`:
        the caller waits for the reply at once (a round trip). A ReplayRequest is encoded by
        the transport where it can (`send_replay`), else as its protobuf message.

        Raises NotSent when the stream had ended with nothing outstanding, so that the
        caller may send it on a new stream with nothing reordered. A stream that ends after
        the request went out fails `op` with the stream's status.
        """
        with self._lock:
            if len(self._pending) >= self._window or not self.transport.can_send():
                self._progress(lambda: self._ended or self._closing or (
                    len(self._pending) < self._window and self.transport.can_send()))
            if self._ended or self._closing:
                raise NotSent()
            transport = self.transport
            alone = awaited and not self._pending
            if not alone and not transport.receive_armed():
                transport.arm_receive()
            if request.__class__ is ReplayRequest:
                if self._send_replay is not None:
                    sent = self._send_replay(self._next_seq, self._session, self._resume_next, *request.fields,
                                             alone)
                else:
                    request = request.proto()
            if request.__class__ is not ReplayRequest:
                request.seq = self._next_seq
                request.session = self._session
                request.resume = self._resume_next
                sent = transport.send(request, with_receive=alone)
            if not sent:
                if not self._pending:
                    raise NotSent()
                # Behind others: it fails with them when the end is read; nothing reordered.
                op.error = errors.Unavailable("the session stream ended before the request was sent")
                op.finished = True
                return
            op.seq = self._next_seq
            self._next_seq += 1
            self._resume_next = False
            self._pending.append(op)

    def replay(self, request: "ReplayRequest", outputs: Sequence[Any]) -> Optional[Tuple[int, str]]:
        """One replay's round trip, encoded and decoded by the transport (its `send_replay`
        and `receive_replay`), when it has them and nothing else is outstanding: (code,
        message), the reads copied into `outputs` when code is 0. None where the caller
        takes the general path (submit and wait); nothing was sent then.

        The replay holds the read turn from its send to its reply, so other threads' requests
        sent meanwhile are ordered after it and read after it as usual."""
        transport, send = self.transport, self._send_replay
        if send is None:
            return None
        with self._lock:
            if self._pending or self._reading or self._ended or self._closing or not transport.can_send():
                return None
            seq = self._next_seq
            if not send(seq, self._session, self._resume_next, *request.fields, True):
                return None  # the stream has ended: the general path opens another
            self._next_seq += 1
            self._resume_next = False
            self._reading = True
        reply = None
        try:
            reply = transport.receive_replay(outputs)
        except Ended as end:
            with self._lock:
                self._end(end.error)
            raise end.error from None
        except ValueError as e:  # a reply that does not match the request
            raise errors.Internal(f"replay of graph {request.graph}: {e}") from None
        except BaseException:  # KeyboardInterrupt while waiting: the reply is still due
            with self._lock:
                placeholder = Operation()
                placeholder.seq = seq
                self._pending.appendleft(placeholder)  # read, and dropped, as any other's
            raise
        finally:
            with self._lock:
                self._reading = False
                if reply is not None and reply[1] != 0 and reply[1] != _ABORTED:
                    self._resume_next = True
                if self._pending and not self._ended and not transport.receive_armed():
                    transport.arm_receive()  # requests sent meanwhile await their replies
                if self._waiting:
                    self._turn.notify_all()
        got_seq, code, message, final, _ = reply
        if got_seq != seq or not final:
            raise errors.Internal(f"replay of graph {request.graph}: the daemon answered request {got_seq} "
                                  f"({'final' if final else 'not final'}) for request {seq}")
        return code, message

    def wait(self, op: Operation, until: Optional[Callable[[], bool]] = None) -> None:
        """Returns once `op` has finished, or once `until()` holds (checked under the
        stream's lock after each event read)."""
        with self._lock:
            if until is None:
                self._progress(lambda: op.finished, True)
            else:
                self._progress(lambda: op.finished or until(), True)

    def drain(self) -> None:
        """Returns once every operation submitted so far has finished."""
        with self._lock:
            if self._pending:
                last = self._pending[-1]
                self._progress(lambda: last.finished, True)

    def close(self) -> None:
        """Ends the stream once every outstanding operation has finished. Idempotent."""
        with self._lock:
            if not self._closing:
                self._progress(lambda: not self._pending, True)
                self._progress(self.transport.can_send)
                self._closing = True
                if not self._ended:
                    self.transport.close()
            self._progress(lambda: self._ended, True)

    def cancel(self) -> None:
        """Breaks the stream: what is outstanding fails; the daemon runs nothing more of
        it. For a session dropped without close; does not wait."""
        with self._lock:
            self._closing = True
        self.transport.cancel()

    # Requires the lock. Reads (taking the turn) or waits for the reader until `until()`
    # holds or the stream has ended. `message_only`: `until` waits on replies only, so the
    # transport need not return for a send's completion while a reply is due.
    def _progress(self, until: Callable[[], bool], message_only: bool = False) -> None:
        while not until() and not self._ended:
            if self._reading:
                self._waiting += 1
                self._turn.wait()
                self._waiting -= 1
                continue
            self._reading = True
            self._lock.release()
            try:
                self._read_one(message_only)
            finally:
                self._lock.acquire()
                self._reading = False
                if self._waiting:
                    self._turn.notify_all()

    # Requires the lock. The stream has ended with `error`: what is outstanding fails with it.
    def _end(self, error: errors.Error) -> None:
        failed = list(self._pending)
        self._pending.clear()
        for op in failed:
            op.error = error
            op.finished = True
        self._ended = True

    # Requires the read turn, not the lock. Reads one event and dispatches its reply; at
    # the end of the stream fails everything outstanding with its status.
    def _read_one(self, message_only: bool = False) -> None:
        pending = self._pending  # only the turn's holder pops: its front stays put
        outputs = pending[0].outputs if pending else None
        try:
            if outputs is not None and self._poll_replay is not None:
                reply = self._poll_replay(message_only, outputs)  # the front's reply, decoded
            else:
                reply = self.transport.poll(message_only)
        except Ended as end:
            with self._lock:
                self._end(end.error)
            return
        if reply is None:
            return  # a send completed, or metadata: the caller's condition may hold now
        with self._lock:
            pending = self._pending
            op = pending[0] if pending and pending[0].seq == reply.seq else None
            if not (len(pending) == 1 and reply.final) and not self.transport.receive_armed():
                self.transport.arm_receive()  # more replies are due
            if op is None:
                return  # a reply to nothing sent: ignore it
            if reply.final:
                pending.popleft()
                if reply.code != 0:
                    op.error = errors.from_number(reply.code, reply.message)
                    if reply.code != _ABORTED:
                        self._resume_next = True
                else:
                    op.reply = reply
                op.finished = True
                return
        if op.partial is not None:  # outside the lock: it may take its time
            op.partial(reply)
