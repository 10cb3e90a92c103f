"""Captures and graphs: record a session's launches once, then replay them with new
parameters, one at a time, pipelined, or as a replay sequence.

    with s.capture(inputs=[x], outputs=[y], pos=(1, 256)) as cap:
        s.launch(step, [y, x, "pos"], global_="pos", pos=1)
    g = cap.graph
    y_now, = g.replay(pos=17, reads=[y])              # one round trip
    futures = [g.replay_async(pos=p, reads=[y]) for p in range(1, 65)]
    for reads in g.sequence(pos=range(1, 129), reads=[y]):   # one request
        ...

A replay's parameters are given by name: the capture's inputs and outputs (each defaults
to the buffer captured) and its variables (always given). Reads are views, answered as
numpy arrays of their shape and dtype.
"""

from __future__ import annotations

import collections
import weakref
from typing import (Any, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import numpy as np

from . import errors
from ._stubs import pb
from .session import (INLINE_READ_BYTES, Buffer, DTypeLike, Future, Session, View, Variable, _is_int,
                      _read_length)
from .stream import BUFFER_KIND, INTEGER_KIND, Operation, ReplayRequest, add_params

__all__ = ["Capture", "Graph", "GraphParam", "ReplaySequence"]

Reads = Union[None, View, Sequence[View]]


def _caller_name(buffer: Buffer, scopes: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The one name the caller's code binds `buffer` to (its locals first, then its
    globals), or None when there is none or more than one."""
    for scope in scopes:
        names = [k for k, v in scope.items() if v is buffer and not k.startswith("_")]
        if len(names) == 1:
            return names[0]
        if names:
            return None
    return None


def _named(kind: str, buffers: Union[Sequence[Buffer], Mapping[str, Buffer]],
           scopes: Sequence[Mapping[str, Any]]) -> List[Tuple[str, Buffer]]:
    if isinstance(buffers, Mapping):
        items = list(buffers.items())
    else:
        items = []
        for i, b in enumerate(buffers):
            name = b.name or _caller_name(b, scopes) if isinstance(b, Buffer) else None
            items.append((name or f"{kind}{i}", b))
    for name, b in items:
        if not isinstance(b, Buffer):
            raise errors.InvalidArgument(f"capture {kind}put {name}: {b!r} is not a buffer (a graph's buffer "
                                         "parameters are whole buffers)")
    return items


class Capture:
    """An open capture (see `Session.capture`). `graph` is the result once the block ends."""

    def __init__(self, session: Session, inputs: Any, outputs: Any,
                 variables: Mapping[str, Union[Variable, Tuple[int, ...]]],
                 scopes: Sequence[Mapping[str, Any]] = ()) -> None:
        self.session = session
        self.inputs = _named("in", inputs, scopes)
        self.outputs = _named("out", outputs, scopes)
        self.variables: Dict[str, Variable] = {n: Variable.of(n, v) for n, v in variables.items()}
        self._scratch: List[Buffer] = []
        self._graph: Optional[Graph] = None
        self._open = False

    def __enter__(self) -> "Capture":
        s = self.session
        if s._capture is not None:
            raise errors.FailedPrecondition(f"session {s.id:016x} is already capturing")
        req = pb.BeginCaptureRequest(session=s.id, inputs=[b.handle for _, b in self.inputs],
                                     variables=[v.proto(n) for n, v in self.variables.items()])
        s._unary(s._stub.BeginCapture, req)
        s._capture = self
        self._open = True
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        s = self.session
        try:
            for b in self._scratch:  # freed inside the capture: internals of the graph
                b.free()
            if exc_type is None:
                self._end()
        finally:
            if self._open:  # an error in the block, or an EndCapture that failed
                self._open = False
                s._capture = None
                try:
                    s._unary(s._stub.EndCapture, pb.EndCaptureRequest(session=s.id, discard=True))
                except errors.Error:
                    pass  # the error that brought us here is the one to see

    def scratch(self, shape: Union[int, Iterable[int]], dtype: DTypeLike = np.float32) -> Buffer:
        """A buffer for the capture's temporaries: freed as the capture ends, so that it
        becomes an internal of the graph, placed in its arena by the memory plan."""
        b = self.session.empty(shape, dtype)
        self._scratch.append(b)
        return b

    @property
    def graph(self) -> "Graph":
        """The captured graph; FailedPrecondition before the capture has ended."""
        if self._graph is None:
            raise errors.FailedPrecondition("the capture has not ended (or was discarded): no graph")
        return self._graph

    def _end(self) -> None:
        s = self.session
        reply = s._unary(s._stub.EndCapture,
                         pb.EndCaptureRequest(session=s.id, outputs=[b.handle for _, b in self.outputs]))
        self._open = False
        s._capture = None
        named: List[Tuple[str, Buffer]] = []
        seen = set()
        for name, b in self.inputs + self.outputs:  # an output also an input is one parameter
            if b.handle not in seen:
                seen.add(b.handle)
                named.append((name, b))
        self._graph = Graph(s, reply, named)


class GraphParam:
    """One parameter of a graph: a buffer (`bytes`: the least size it takes; `default`:
    the buffer captured) or a variable (`variable`: its range)."""

    __slots__ = ("name", "index", "bytes", "variable", "default")

    def __init__(self, name: str, index: int, nbytes: int = 0, variable: Optional[Variable] = None,
                 default: Optional[Buffer] = None) -> None:
        self.name, self.index, self.bytes, self.variable, self.default = name, index, nbytes, variable, default

    @property
    def is_buffer(self) -> bool:
        return self.variable is None

    def __repr__(self) -> str:
        what = f"buffer of at least {self.bytes} bytes" if self.is_buffer else f"variable in {self.variable}"
        return f"<param {self.index} {self.name}: {what}>"


def _decode(view: View, data: bytes) -> np.ndarray:
    if len(data) != view.nbytes:
        raise errors.Internal(f"{view}: the daemon answered {len(data)} of its {view.nbytes} bytes")
    return np.frombuffer(data, view.dtype).reshape(view.shape).copy()


class Graph:
    """A captured graph held by a handle (freed by `free()`, its session's close, or once
    garbage-collected). `params` is its parameter layout: buffers, then variables."""

    def __init__(self, session: Session, reply: pb.GraphReply, buffers: Sequence[Tuple[str, Buffer]]) -> None:
        self.session = session
        self.handle: int = reply.graph
        self.key: str = reply.key
        self.cache_hit: bool = reply.cache_hit
        self.calls: int = reply.calls
        self.batches: int = reply.batches
        self.arena_bytes: int = reply.arena_bytes
        self.plan_saved_bytes: int = reply.plan_saved_bytes
        self.cache_stats = reply.cache
        params: List[GraphParam] = []
        buffer_params = [p for p in reply.params if p.WhichOneof("kind") == "buffer_bytes"]
        names = list(buffers) if len(buffers) == len(buffer_params) else [
            (f"param{p.index}", None) for p in buffer_params]
        for (name, default), p in zip(names, buffer_params):
            params.append(GraphParam(name, p.index, nbytes=p.buffer_bytes, default=default))
        for p in reply.params:
            if p.WhichOneof("kind") == "variable":
                v = p.variable
                params.append(GraphParam(v.name, p.index, variable=Variable(v.min, v.max, v.multiple_of or 1)))
        params.sort(key=lambda q: q.index)
        self._finalizer = weakref.finalize(self, session._garbage.append, ("graph", self.handle))
        self._finalizer.atexit = False
        self.params: Tuple[GraphParam, ...] = tuple(params)
        # Per parameter, b"b" (a buffer handle) or b"i" (an integer): the kinds of `_values`.
        self._kinds = bytes(BUFFER_KIND if p.is_buffer else INTEGER_KIND for p in params)
        self._by_name = {p.name: p for p in params}
        if len(self._by_name) != len(params):  # the handle is freed with this object
            raise errors.InvalidArgument(f"graph {self.handle}: two parameters share a name "
                                         f"({[p.name for p in params]}); name the capture's buffers")

    # -- replays -----------------------------------------------------------------------

    def replay(self, reads: Reads = None, wait: bool = False, **params: Any) -> Any:
        """Replays the graph once and returns the contents of `reads` after it: a numpy
        array for a single view, a list of them for a list (None without reads).

        `**params` are its parameters by name: buffers (default: the one captured) and
        variables (required). Reads of up to 1 MiB in all come back in the replay's reply;
        larger ones are read after it. With `wait`, returns once the replay has run.
        """
        views, single = self._reads(reads)
        values = self._values(params)
        if sum(v.nbytes for v in views) > INLINE_READ_BYTES:
            self.session._run(self._request(values, True, []))
            arrays = [v.numpy() for v in views]
        else:
            request = self._request(values, wait, views)
            arrays = self.session._replay_round_trip(request, views)
            if arrays is None:  # not on this transport, or not now: the general path
                reply = self.session._run(request)
                arrays = [_decode(v, d) for v, d in zip(views, reply.replay.reads)]
        return self._shape_result(arrays, reads, single)

    def replay_async(self, reads: Reads = None, wait: bool = False, **params: Any) -> Future:
        """`replay` without waiting: a Future whose result() is what replay returns.

        Replays issued from one thread run in order; up to the client's window are sent
        before the oldest reply is read. Reads are limited to 1 MiB in all.
        """
        views, single = self._reads(reads)
        request = self._request(self._values(params), wait, views)
        stream = self.session._stream
        # Where a transport that decodes replays itself copies the reads (None: its reply
        # is a SessionReply, decoded here).
        decodes = stream is not None and stream.decodes_replays
        outputs = [np.empty(v.shape, v.dtype) for v in views] if decodes else None
        op = Operation(outputs=outputs)
        stream = self.session._submit(request, op)

        def decode(reply: Any) -> Any:
            if reply.__class__ is not pb.SessionReply:  # decoded by the transport, into outputs
                return self._shape_result(outputs, reads, single)
            return self._shape_result([_decode(v, d) for v, d in zip(views, reply.replay.reads)], reads, single)

        return Future(stream, op, decode)

    def sequence(self, reads: Reads = None, **params: Any) -> "ReplaySequence":
        """Runs a replay sequence, one request for many replays; iterate it for each
        replay's reads as they stream back.

        One parameter given as a `range` steps (`pos=range(1, 129)`: 128 replays with pos
        1, 2, ..., 128); parameters given as lists (or arrays) make one replay per element
        (all of one length), the others staying as given. Everything is checked before the
        first replay runs.
        """
        views, single = self._reads(reads)
        req = pb.SessionRequest()
        seq = req.replay_sequence
        seq.graph = self.handle
        varying = {k: v for k, v in params.items() if isinstance(v, (range, list, tuple, np.ndarray))}
        if len(varying) == 1 and isinstance(next(iter(varying.values())), range):
            name, r = next(iter(varying.items()))
            if len(r) == 0:
                raise errors.InvalidArgument(f"sequence: {name}={r!r} is empty")
            p = self._by_name.get(name)
            if p is None or p.is_buffer:
                raise errors.InvalidArgument(f"sequence: {name} is not a variable of the graph "
                                             f"(its variables: {[q.name for q in self.params if not q.is_buffer]})")
            base = dict(params)
            base[name] = r.start
            add_params(seq.base, self._kinds, self._values(base))
            seq.step_param = p.index
            seq.step = r.step
            seq.count = len(r)
        elif varying:
            lengths = {k: len(v) for k, v in varying.items()}
            count = next(iter(lengths.values()))
            if len(set(lengths.values())) != 1 or count == 0:
                raise errors.InvalidArgument(f"sequence: the varying parameters' lengths {lengths} must be one, "
                                             "and not 0")
            for i in range(count):
                one = dict(params)
                for k, v in varying.items():
                    one[k] = v[i]
                add_params(seq.vectors.add().params, self._kinds, self._values(one))
        else:
            raise errors.InvalidArgument("sequence: give one parameter as a range (pos=range(1, 129)) or "
                                         "parameters as lists")
        seq.reads.extend(v._proto() for v in views)
        seq.stream_reads = bool(views)
        return ReplaySequence(self, req, views, reads, single)

    def info(self) -> pb.GraphReply:
        """The daemon's description now: replays so far, the graph cache's statistics."""
        s = self.session
        return s._unary(s._stub.GraphInfo, pb.GraphInfoRequest(session=s.id, graph=self.handle))

    def free(self) -> None:
        """Drops the graph handle now. Idempotent."""
        if self._finalizer.detach() is not None and not self.session.closed:
            self.session._free("graph", self.handle)

    # -- plumbing ----------------------------------------------------------------------

    def _request(self, values: List[int], wait: bool, views: Sequence[View]) -> ReplayRequest:
        return ReplayRequest(self.handle, values, self._kinds, wait,
                             [(v.buffer.handle, v.offset, _read_length(v)) for v in views])

    def _values(self, given: Mapping[str, Any]) -> List[int]:
        """The parameter vector for `given` (name -> value): each parameter's buffer handle
        or integer, in the graph's layout (`_kinds` says which is which)."""
        left = len(given)
        values = []
        for p in self.params:
            v = given.get(p.name, p.default)
            if p.name in given:
                left -= 1
            if p.variable is None:
                if v.__class__ is not Buffer and not isinstance(v, Buffer):
                    raise errors.InvalidArgument(f"graph {self.handle}: parameter {p.name} takes a buffer, not "
                                                 f"{type(v).__name__}")
                d = p.default
                if d is not None and v is not d and v.dtype != d.dtype:
                    raise errors.InvalidArgument(f"graph {self.handle}: parameter {p.name} was captured as a "
                                                 f"{d.dtype} buffer; got {v!r}")
                values.append(v.handle)
            else:
                if v is None:
                    raise errors.InvalidArgument(f"graph {self.handle}: variable {p.name} needs a value "
                                                 f"(range {p.variable})")
                if v.__class__ is not int and not _is_int(v):
                    raise errors.InvalidArgument(f"graph {self.handle}: variable {p.name}={v!r} is not an integer")
                values.append(int(v))
        if left:
            unknown = sorted(set(given) - set(self._by_name))
            raise errors.InvalidArgument(f"graph {self.handle}: no parameter named {', '.join(unknown)} "
                                         f"(its parameters: {[p.name for p in self.params]})")
        return values

    def _reads(self, reads: Reads) -> Tuple[List[View], bool]:
        if reads is None:
            return [], False
        if isinstance(reads, View):
            if reads.buffer.session is not self.session:
                raise errors.InvalidArgument(f"reads: {reads!r} belongs to another session")
            return [reads], True
        views, single = list(reads), False
        for v in views:
            if not isinstance(v, View):
                raise errors.InvalidArgument(f"reads: {v!r} is not a view or buffer")
            if v.buffer.session is not self.session:
                raise errors.InvalidArgument(f"reads: {v!r} belongs to another session")
        return views, single

    @staticmethod
    def _shape_result(arrays: List[np.ndarray], reads: Reads, single: bool) -> Any:
        if reads is None:
            return None
        return arrays[0] if single else arrays

    def __repr__(self) -> str:
        return (f"<graph {self.handle}: {self.calls} calls in {self.batches} batch(es), key {self.key[:16]}, "
                f"params {[p.name for p in self.params]}>")


class ReplaySequence:
    """A replay sequence sent on the session's stream. Iterating it yields each replay's
    reads (an array, or a list of them) as they arrive; once it is exhausted (or after
    `wait()`), `replays` and `device_seconds` hold the daemon's totals.

    The sequence runs on the daemon whether or not it is iterated; a sequence left
    unread keeps its replies until another call of the session reads past them.
    """

    def __init__(self, graph: Graph, request: pb.SessionRequest, views: List[View], reads: Reads,
                 single: bool) -> None:
        self.graph = graph
        self.replays: Optional[int] = None
        self.device_seconds: Optional[float] = None
        self._views, self._reads, self._single = views, reads, single
        self._arrived: Deque[pb.ReplaySequenceReply] = collections.deque()
        self._op = Operation(partial=lambda reply: self._arrived.append(reply.sequence))
        self._final_taken = False
        self._stream = graph.session._submit(request, self._op)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        while True:
            if self._arrived:
                return self._decode(self._arrived.popleft())
            if self._op.finished:
                if self._final_taken:
                    raise StopIteration
                self._final_taken = True
                final = self._op.result().sequence
                self.replays, self.device_seconds = final.replays, final.device_seconds
                if self._views and len(final.reads):
                    return self._decode(final)
                raise StopIteration
            self._stream.wait(self._op, until=lambda: bool(self._arrived))

    def wait(self) -> "ReplaySequence":
        """Runs to the end, dropping the reads not yet taken; returns self."""
        for _ in self:
            pass
        return self

    def _decode(self, reply: pb.ReplaySequenceReply) -> Any:
        return Graph._shape_result([_decode(v, d) for v, d in zip(self._views, reply.reads)], self._reads,
                                   self._single)
