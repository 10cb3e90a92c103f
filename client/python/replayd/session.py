"""Sessions and what they own: buffers (and views of them) from and to numpy, programs,
launches, copies; captures and graphs are in `replayd.graph`.

A session closes on `close()` or at the end of its `with` block, freeing everything it
owned on the daemon; a buffer, program or graph handle that is garbage-collected is freed
at the session's next call. Launches, copies and replays go over the session's Session
stream, in order; every other call first waits for what the stream has outstanding, so
calls from one thread are always ordered as written.

Thread safety: a Session and its handles may be used from several threads; the daemon
orders their operations as they arrive.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import (Any, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import grpc
import numpy as np

from . import errors
from ._stubs import pb
from .client import Client, Device
from .stream import NotSent, Operation, ReplayRequest, SessionStream, open_transport

__all__ = ["Buffer", "Future", "Program", "Session", "View", "Variable", "parse_signature", "CHUNK_BYTES"]

# The daemon takes and answers buffer contents in chunks of at most 1 MiB (WriteBuffer,
# ReadBuffer), and a replay's reads up to 1 MiB in all.
CHUNK_BYTES = 1 << 20
INLINE_READ_BYTES = 1 << 20

Shape = Tuple[int, ...]
DTypeLike = Union[np.dtype, type, str]


def _shape(shape: Union[int, Iterable[int]]) -> Shape:
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
            raise errors.InvalidArgument(f"shape {dims!r}: dimensions must be non-negative integers")
    return tuple(int(d) for d in dims)


def _dtype(dtype: DTypeLike) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise errors.InvalidArgument(f"dtype {dt}: buffers hold fixed-size values, not Python objects")
    return dt


def _nbytes(shape: Shape, dtype: np.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


class View:
    """A typed window on a buffer: a byte offset, a shape and a dtype. Kernels receive
    views; `numpy()` reads one, `write()` writes one. Slicing along the first axis
    (`buf[16:32]`, `buf[3]`) and `view()` make narrower views of the same memory."""

    __slots__ = ("buffer", "offset", "shape", "dtype", "nbytes")

    def __init__(self, buffer: "Buffer", offset: int, shape: Shape, dtype: np.dtype) -> None:
        self.buffer = buffer
        self.offset = offset
        self.shape = shape
        self.dtype = dtype
        self.nbytes = _nbytes(shape, dtype)

    @property
    def size(self) -> int:
        """The number of elements."""
        return self.nbytes // self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d view")
        return self.shape[0]

    def numpy(self) -> np.ndarray:
        """The view's contents as a new numpy array (read in chunks of at most 1 MiB)."""
        return self.buffer.session._read(self)

    def write(self, array: Any) -> None:
        """Writes `array`, of exactly this view's dtype and shape, into the view."""
        self.buffer.session._write(self, self._check(array))

    def view(self, shape: Union[None, int, Iterable[int]] = None, dtype: Optional[DTypeLike] = None,
             byte_offset: int = 0) -> "View":
        """A view `byte_offset` bytes into this one, of `shape` and `dtype` (default: this
        view's dtype, and as many elements as fit in the rest of it)."""
        dt = self.dtype if dtype is None else _dtype(dtype)
        if not isinstance(byte_offset, (int, np.integer)) or byte_offset < 0 or byte_offset > self.nbytes:
            raise errors.InvalidArgument(f"{self}: byte offset {byte_offset} is outside its {self.nbytes} bytes")
        if shape is None:
            shape = ((self.nbytes - byte_offset) // dt.itemsize,)
        sh = _shape(shape)
        v = View(self.buffer, self.offset + int(byte_offset), sh, dt)
        if byte_offset + v.nbytes > self.nbytes:
            raise errors.InvalidArgument(
                f"{self}: a {dt} view of shape {sh} at byte offset {byte_offset} needs {v.nbytes} bytes, "
                f"past its {self.nbytes}")
        return v

    def __getitem__(self, key: Union[int, slice]) -> "View":
        if not self.shape:
            raise errors.InvalidArgument(f"{self}: a 0-d view cannot be indexed")
        rows = self.shape[0]
        row_bytes = self.nbytes // rows if rows else _nbytes(self.shape[1:], self.dtype)
        if isinstance(key, (int, np.integer)):
            i = int(key) + rows if key < 0 else int(key)
            if not 0 <= i < rows:
                raise IndexError(f"index {key} is out of bounds for a view of {rows} rows")
            return View(self.buffer, self.offset + i * row_bytes, self.shape[1:], self.dtype)
        if isinstance(key, slice):
            start, stop, step = key.indices(rows)
            if step != 1:
                raise errors.InvalidArgument(f"{self}: views are contiguous: slice step {step} is not 1")
            n = max(0, stop - start)
            return View(self.buffer, self.offset + start * row_bytes, (n,) + self.shape[1:], self.dtype)
        raise TypeError(f"views are indexed by an int or a slice along the first axis, not {key!r}")

    def _check(self, array: Any) -> np.ndarray:
        a = np.asarray(array)
        if a.dtype != self.dtype:
            raise errors.InvalidArgument(
                f"{self}: a {a.dtype} array cannot be written to a {self.dtype} view (convert it with .astype)")
        if a.shape != self.shape:
            raise errors.InvalidArgument(f"{self}: an array of shape {a.shape} cannot be written to a view of "
                                         f"shape {self.shape}")
        return np.ascontiguousarray(a)

    def _proto(self) -> pb.View:
        if self.nbytes == 0:  # length 0 on the wire means "to the end of the buffer"
            raise errors.InvalidArgument(f"{self} is empty")
        return pb.View(buffer=self.buffer.handle, offset=self.offset, length=self.nbytes)

    def __repr__(self) -> str:
        return (f"<view of buffer {self.buffer.label} at byte {self.offset}: {self.dtype} "
                f"{self.shape}>")


class Buffer(View):
    """Device memory of a fixed byte size, as a view of all of it with a shape and dtype.
    Freed by `free()`, by its session's close, or once garbage-collected."""

    __slots__ = ("session", "handle", "name", "_finalizer", "__weakref__")

    def __init__(self, session: "Session", handle: int, shape: Shape, dtype: np.dtype,
                 name: Optional[str] = None) -> None:
        # Not View.__init__: a buffer is its own `buffer` (a property), with no reference
        # cycle that would hold off its finalizer until a garbage collection.
        self.offset = 0
        self.shape = shape
        self.dtype = dtype
        self.nbytes = _nbytes(shape, dtype)
        self.session = session
        self.handle = handle
        self.name = name
        self._finalizer = weakref.finalize(self, session._garbage.append, ("buffer", handle))
        self._finalizer.atexit = False

    @property  # type: ignore[override]
    def buffer(self) -> "Buffer":
        return self

    @property
    def label(self) -> str:
        return f"{self.handle}" + (f" ({self.name})" if self.name else "")

    def free(self) -> None:
        """Frees the device memory now; a later use of the buffer is NotFound. Idempotent."""
        if self._finalizer.detach() is not None and not self.session.closed:
            self.session._free("buffer", self.handle)

    def __repr__(self) -> str:
        return f"<buffer {self.label}: {self.dtype} {self.shape}, {self.nbytes} bytes>"


class Program:
    """A loaded kernel: its handle, the content key of its compiled artifact, its compile
    time (0 on a compile-cache hit) and signature. Freed by `free()`, the session's close,
    or once garbage-collected."""

    def __init__(self, session: "Session", reply: pb.LoadProgramReply, entry: str, fmt: str,
                 signature: pb.Signature) -> None:
        self.session = session
        self.handle = reply.program
        self.key = reply.key
        self.compile_seconds = reply.compile_seconds
        self.cache_hit = reply.cache_hit
        self.entry = entry
        self.format = fmt
        self.signature = signature
        self._finalizer = weakref.finalize(self, session._garbage.append, ("program", self.handle))
        self._finalizer.atexit = False

    def free(self) -> None:
        """Unloads the program now. Idempotent."""
        if self._finalizer.detach() is not None and not self.session.closed:
            self.session._free("program", self.handle)

    def __repr__(self) -> str:
        return f"<program {self.handle}: {self.format} {self.entry}, key {self.key[:16]}>"


class Variable:
    """A variable's range: min <= value <= max, value % multiple_of == 0. The name is the
    keyword it is given under: `s.capture(inputs=[x], pos=Variable(1, 256))`, or the tuple
    `pos=(1, 256)` (or `(1, 256, 8)` with a multiple)."""

    __slots__ = ("min", "max", "multiple_of")

    def __init__(self, min: int, max: int, multiple_of: int = 1) -> None:
        self.min, self.max, self.multiple_of = int(min), int(max), int(multiple_of)

    @classmethod
    def of(cls, name: str, spec: Union["Variable", Tuple[int, ...]]) -> "Variable":
        if isinstance(spec, Variable):
            return spec
        if isinstance(spec, tuple) and len(spec) in (2, 3) and all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in spec):
            return cls(*spec)
        raise errors.InvalidArgument(
            f"variable {name}: {spec!r} is not a range: give (min, max), (min, max, multiple_of) or a Variable")

    def proto(self, name: str) -> pb.Variable:
        return pb.Variable(name=name, min=self.min, max=self.max, multiple_of=self.multiple_of)

    def __repr__(self) -> str:
        return f"Variable({self.min}, {self.max}, {self.multiple_of})"


_KINDS = {
    "in": (pb.Param.BUFFER, pb.Param.IN),
    "out": (pb.Param.BUFFER, pb.Param.OUT),
    "inout": (pb.Param.BUFFER, pb.Param.INOUT),
    "int32": (pb.Param.INT32, pb.Param.ACCESS_UNSPECIFIED),
    "int64": (pb.Param.INT64, pb.Param.ACCESS_UNSPECIFIED),
}


def parse_signature(text: str, core_id: bool = False) -> pb.Signature:
    """A signature from its compact text: comma-separated `in`, `out`, `inout`, `int32`,
    `int64`, each optionally named (`out:y,in:x,int32:n`; names appear in the daemon's
    error messages). With `core_id` (cpu-c) each invocation also receives its index."""
    sig = pb.Signature(core_id=core_id)
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        kind, _, name = word.partition(":")
        if kind.strip() not in _KINDS:
            raise errors.InvalidArgument(
                f"signature {text!r}: unknown word {kind.strip()!r} (in, out, inout, int32, int64)")
        k, access = _KINDS[kind.strip()]
        sig.params.add(kind=k, access=access, name=name.strip())
    return sig


def _read_length(view: View) -> int:
    """The length of a read of `view` on the wire."""
    if not view.nbytes:  # length 0 on the wire means "to the end of the buffer"
        raise errors.InvalidArgument(f"reads: {view} is empty")
    return view.nbytes


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _expr(v: Union[int, str]) -> pb.Expr:
    return pb.Expr(constant=int(v)) if _is_int(v) else pb.Expr(text=v)


def _dims(name: str, dims: Union[None, int, str, Sequence[Union[int, str]]],
          plain: Any, symbolic: Any) -> None:
    """Fills `plain` with numeric dimensions, or all of them as expressions into
    `symbolic` when any is an expression (text such as "(pos + 31) // 32")."""
    if dims is None:
        return
    ds = [dims] if isinstance(dims, (int, np.integer, str)) else list(dims)
    if len(ds) > 3:
        raise errors.InvalidArgument(f"{name}: {len(ds)} dimensions, at most 3")
    for d in ds:
        if not (_is_int(d) or isinstance(d, str)):
            raise errors.InvalidArgument(f"{name}: {d!r} is neither an integer nor an expression's text")
    if any(isinstance(d, str) for d in ds):
        symbolic.extend(_expr(d) for d in ds)
    else:
        if any(d < 1 for d in ds):
            raise errors.InvalidArgument(f"{name}: dimensions {ds} must be at least 1")
        plain.extend(int(d) for d in ds)


class Session:
    """A workspace on one device: owns buffers, programs and graphs; holds a lease that
    every call renews. Open with `Client.session`; use as a context manager."""

    def __init__(self, client: Client, device: str, reply: pb.OpenSessionReply) -> None:
        self.client = client
        self.id: int = reply.session
        self.device_id = device
        self.tenant: str = reply.tenant
        self.lease_seconds: int = reply.lease_seconds
        self._stub = client._stub
        self._metadata = client._metadata
        self._window = client.window
        self._lock = threading.Lock()
        self._stream: Optional[SessionStream] = None
        self._closed = False
        self._device: Optional[Device] = None
        self._garbage: List[Tuple[str, int]] = []  # handles collected, freed at the next call
        self._capture: Optional[Any] = None  # the open replayd.graph.Capture
        # The stream, for the finalizer of a session dropped without close().
        self._box: List[Optional[SessionStream]] = [None]
        self._finalizer = weakref.finalize(self, Session._abandon, self._stub, self._metadata,
                                           self.id, self._box)
        self._finalizer.atexit = False

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes the session: waits for its stream's outstanding operations, then frees
        everything it owns on the daemon. Later calls raise NotFound. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            stream, self._stream = self._stream, None
        self._finalizer.detach()
        if stream is not None:
            stream.close()
        self._box[0] = None
        try:
            self._stub.CloseSession(pb.CloseSessionRequest(session=self.id), metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the block's error is the one to see
            self.close()
        except errors.Error:
            pass

    def keep_alive(self) -> int:
        """Renews the lease; returns its seconds."""
        return self._unary(self._stub.KeepAlive, pb.KeepAliveRequest(session=self.id)).lease_seconds

    @property
    def device(self) -> Device:
        """The session's device, as ListDevices described it when first asked."""
        if self._device is None:
            self._device = self.client.device(self.device_id)
        return self._device

    @property
    def target(self) -> str:
        """The daemon the session runs on: its client's target ("127.0.0.1:7070")."""
        return self.client.target

    # -- buffers -----------------------------------------------------------------------

    def empty(self, shape: Union[int, Iterable[int]], dtype: DTypeLike = np.float32,
              name: Optional[str] = None) -> Buffer:
        """A buffer of `shape` and `dtype`. Device memory starts zeroed. `name` names it in
        a graph's parameters when it is a capture's input or output."""
        sh, dt = _shape(shape), _dtype(dtype)
        nbytes = _nbytes(sh, dt)
        reply = self._unary(self._stub.AllocBuffer, pb.AllocBufferRequest(session=self.id, bytes=nbytes))
        return Buffer(self, reply.buffer, sh, dt, name)

    zeros = empty

    def array(self, array: Any, name: Optional[str] = None) -> Buffer:
        """A buffer holding a copy of `array` (any numpy array or array-like of fixed-size
        values), with its shape and dtype."""
        a = np.ascontiguousarray(array)
        buf = self.empty(a.shape, a.dtype, name)
        if a.nbytes:
            self._write(buf, a)
        return buf

    def copy(self, dst: View, src: View, wait: bool = False) -> None:
        """A device-to-device copy from `src` to `dst`: views of one byte length that do not
        overlap, ordered with launches and replays, and recorded by a capture."""
        if not isinstance(dst, View) or not isinstance(src, View):
            raise errors.InvalidArgument("copy takes two views (buffers, or slices of them)")
        if dst.nbytes != src.nbytes:
            raise errors.InvalidArgument(f"copy from {src} ({src.nbytes} bytes) to {dst} ({dst.nbytes} bytes): "
                                         "the lengths differ")
        req = pb.SessionRequest()
        req.copy.dst.CopyFrom(dst._proto())
        req.copy.src.CopyFrom(src._proto())
        req.copy.wait = wait
        self._run(req)

    def synchronize(self) -> None:
        """Waits until every operation submitted on the session has completed on the device."""
        req = pb.SessionRequest()
        req.synchronize.SetInParent()
        self._run(req)

    def _write(self, view: View, a: np.ndarray) -> None:
        raw = memoryview(a).cast("B")
        handle, base, session = view.buffer.handle, view.offset, self.id

        def chunks() -> Iterator[pb.WriteChunk]:
            done = 0
            while True:
                n = min(CHUNK_BYTES, len(raw) - done)
                yield pb.WriteChunk(session=session, buffer=handle, offset=base + done,
                                    data=raw[done:done + n].tobytes())
                done += n
                if done >= len(raw):
                    return

        reply = self._unary(self._stub.WriteBuffer, chunks())
        if reply.bytes_written != len(raw):
            raise errors.Internal(f"{view}: the daemon wrote {reply.bytes_written} of {len(raw)} bytes")

    def _read(self, view: View) -> np.ndarray:
        out = np.empty(view.shape, view.dtype)
        if view.nbytes == 0:
            return out
        raw = memoryview(out).cast("B")
        self._prepare()
        req = pb.ReadBufferRequest(session=self.id, buffer=view.buffer.handle, offset=view.offset,
                                   length=view.nbytes)
        got = 0
        try:
            for chunk in self._stub.ReadBuffer(req, metadata=self._metadata):
                at, n = chunk.offset - view.offset, len(chunk.data)
                if chunk.offset < view.offset or at + n > view.nbytes:
                    raise errors.Internal(f"{view}: ReadBuffer answered bytes [{chunk.offset}, "
                                          f"{chunk.offset + n}) outside the requested range")
                raw[at:at + n] = chunk.data
                got += n
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        if got != view.nbytes:
            raise errors.Internal(f"{view}: ReadBuffer answered {got} of {view.nbytes} bytes")
        return out

    # -- programs and launches ---------------------------------------------------------

    def program(self, source: Union[str, bytes], entry: str, signature: Union[str, pb.Signature] = "",
                format: Optional[str] = None, options: Sequence[str] = (), core_id: bool = False) -> Program:
        """Compiles (or finds in the daemon's compile cache) and loads a kernel.

        `signature` is the kernel's parameters in order ("out,in,in,int32", see
        `parse_signature`); `format` defaults to the device's source format ("cpu-c" on
        cpu:0); `options` are compiler options (cpu-c: -O0..-O3, -Os, -ffast-math, -march=native,
        -DNAME[=VALUE]). A compile error raises InvalidArgument carrying the compiler's
        diagnostics.
        """
        sig = signature if isinstance(signature, pb.Signature) else parse_signature(signature, core_id)
        fmt = format or self.device.source_format
        code = source.encode() if isinstance(source, str) else bytes(source)
        req = pb.LoadProgramRequest(session=self.id, format=fmt, code=code, entry=entry, signature=sig,
                                    options=list(options))
        return Program(self, self._unary(self._stub.LoadProgram, req), entry, fmt, sig)

    def launch(self, program: Program, args: Sequence[Any], global_: Any = 1, local: Any = None, *,
               wait: bool = False, **variables: int) -> Optional[float]:
        """Launches `program` once, in order with the session's other launches and replays.

        `args` follow the signature: a view (or buffer) for a buffer parameter; an int, or an
        expression's text over the variables ("pos", "(pos + 31) // 32") for an integer.
        `global_` and `local` are up to 3 dimensions, each an int or an expression's text.
        `**variables` bind values (`pos=17`); inside a capture a variable takes the range the
        capture declared, and outside one the range of just its value. With `wait`, returns
        once the kernel has run, with its device time in seconds.
        """
        req = pb.SessionRequest()
        self._launch_request(req.launch, program, args, global_, local, wait, variables)
        reply = self._run(req)
        return reply.launch.device_seconds if wait else None

    def launch_async(self, program: Program, args: Sequence[Any], global_: Any = 1, local: Any = None, *,
                     wait: bool = False, **variables: int) -> "Future":
        """`launch` without waiting for its reply: a Future whose result() is launch's."""
        req = pb.SessionRequest()
        self._launch_request(req.launch, program, args, global_, local, wait, variables)
        op = Operation()
        stream = self._submit(req, op)
        return Future(stream, op, lambda reply: reply.launch.device_seconds if wait else None)

    def _launch_request(self, out: pb.LaunchRequest, program: Program, args: Sequence[Any], global_: Any,
                        local: Any, wait: bool, variables: Mapping[str, int]) -> None:
        if not isinstance(program, Program):
            raise errors.InvalidArgument(f"launch: {program!r} is not a Program (load one with session.program)")
        params = program.signature.params
        if len(args) != len(params):
            raise errors.InvalidArgument(f"launch of {program.entry}: {len(args)} arguments, the signature has "
                                         f"{len(params)}")
        out.program = program.handle
        for i, (arg, param) in enumerate(zip(args, params)):
            label = f"launch of {program.entry}: argument {i}" + (f" ({param.name})" if param.name else "")
            a = out.args.add()
            if param.kind == pb.Param.BUFFER:
                if not isinstance(arg, View):
                    hint = " (copy it to the device with session.array)" if isinstance(arg, np.ndarray) else ""
                    raise errors.InvalidArgument(f"{label} is a buffer parameter: got {type(arg).__name__}{hint}")
                if arg.buffer.session is not self:
                    raise errors.InvalidArgument(f"{label}: {arg} belongs to another session")
                a.view.CopyFrom(arg._proto())
            elif _is_int(arg):
                a.int_value = int(arg)
            elif isinstance(arg, str):
                a.expr.text = arg
            else:
                raise errors.InvalidArgument(f"{label} is an integer parameter: got {type(arg).__name__}")
        _dims("global", global_, getattr(out, "global"), out.global_expr)  # a Python keyword
        _dims("local", local, out.local, out.local_expr)
        declared = self._capture.variables if self._capture is not None else {}
        for name, value in variables.items():
            if not _is_int(value):
                raise errors.InvalidArgument(f"variable {name}: {value!r} is not an integer")
            var = declared.get(name) or Variable(value, value)
            out.variables.add(variable=var.proto(name), value=int(value))
        out.wait = wait

    # -- captures and graphs -----------------------------------------------------------

    def capture(self, inputs: Union[Sequence[Buffer], Mapping[str, Buffer]] = (),
                outputs: Union[Sequence[Buffer], Mapping[str, Buffer]] = (),
                **variables: Union[Variable, Tuple[int, ...]]) -> "Capture":
        """A capture, as a context manager: launches and copies in the block run as usual
        and are recorded; at its end they become `capture.graph`.

        `inputs` then `outputs` become the graph's buffer parameters, named by the mapping's
        keys, else by each buffer's `name`, else by the one variable of the calling code
        that holds the buffer (`inputs=[x]` names it x), else in0, in1, ..., out0, ...;
        buffers made and freed inside (see `Capture.scratch`) become internals, other
        buffers constants held by reference. `**variables` declare the variables and their
        ranges (`pos=(1, 256)`). An exception in the block discards the capture.
        """
        from .graph import Capture
        caller = sys._getframe(1)
        try:
            return Capture(self, inputs, outputs, variables, (caller.f_locals, caller.f_globals))
        finally:
            del caller

    # -- plumbing ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise errors.NotFound(f"session {self.id:016x} is closed")

    def _open_stream(self) -> SessionStream:
        with self._lock:
            self._check_open()
            if self._stream is None or not self._stream.healthy():
                transport = open_transport(self.client._channel, self._metadata, self.client.transport,
                                           self.client._native_channel)
                self._stream = SessionStream(transport, self.id, self._window)
                self._box[0] = self._stream
            return self._stream

    def _submit(self, request: Union[pb.SessionRequest, ReplayRequest], op: Operation,
                awaited: bool = False) -> SessionStream:
        """Sends `request` on the session's stream (opened on first use, and again once the
        last has ended) and returns the stream, on which to wait for `op`. `awaited`: the
        caller waits for the reply at once."""
        stream = self._stream
        if stream is None or self._closed:
            stream = self._open_stream()
        try:
            stream.submit(request, op, awaited)
            return stream
        except NotSent:
            pass
        stream = self._open_stream()
        try:
            stream.submit(request, op, awaited)
        except NotSent:
            raise errors.Unavailable(f"session {self.id:016x}: the session stream ended as it opened") from None
        return stream

    def _replay_round_trip(self, request: ReplayRequest, views: Sequence["View"]) -> Optional[List[np.ndarray]]:
        """Runs `request` and returns `views`' contents after it (the request's reads),
        through the transport's own encoding and decoding of a replay (the native
        transport's), when it has one and the stream has nothing else outstanding; None
        otherwise, for the general path."""
        stream = self._stream
        if stream is None or self._closed:
            stream = self._open_stream()
        if not stream.decodes_replays:
            return None
        outputs = [np.empty(v.shape, v.dtype) for v in views]
        result = stream.replay(request, outputs)
        if result is None:
            return None
        code, message = result
        if code:
            raise errors.from_number(code, message)
        return outputs

    def _run(self, request: Union[pb.SessionRequest, ReplayRequest], partial: Any = None) -> pb.SessionReply:
        op = Operation(partial)
        self._submit(request, op, awaited=partial is None).wait(op)
        return op.result()

    def _prepare(self) -> None:
        """Before a unary call: the stream's outstanding operations complete (so that the
        call is ordered after them), and collected handles are freed."""
        self._check_open()
        stream = self._stream
        if stream is not None:
            stream.drain()
        while self._garbage:
            kind, handle = self._garbage.pop()
            self._free(kind, handle, quiet=True)

    def _unary(self, method: Any, request: Any) -> Any:
        self._prepare()
        try:
            return method(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def _free(self, kind: str, handle: int, quiet: bool = False) -> None:
        method, req = {
            "buffer": (self._stub.FreeBuffer, pb.FreeBufferRequest),
            "program": (self._stub.FreeProgram, pb.FreeProgramRequest),
            "graph": (self._stub.FreeGraph, pb.FreeGraphRequest),
        }[kind]
        kw = {kind: handle}
        if quiet:
            try:
                method(req(session=self.id, **kw), metadata=self._metadata)
            except grpc.RpcError:
                pass  # best effort: the session's close frees it anyway
            return
        self._unary(method, req(session=self.id, **kw))

    @staticmethod
    def _abandon(stub: Any, metadata: Any, session: int, box: List[Optional[SessionStream]]) -> None:
        # A session garbage-collected without close(): break its stream and close it on the
        # daemon, best effort (its lease frees it otherwise).
        if box[0] is not None:
            box[0].cancel()
        try:
            stub.CloseSession(pb.CloseSessionRequest(session=session), metadata=metadata, timeout=2)
        except grpc.RpcError:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"lease {self.lease_seconds} s"
        return f"<session {self.id:016x} on {self.device_id}, tenant {self.tenant}: {state}>"


class Future:
    """The result of an operation sent on a session's stream without waiting. No thread
    reads in the background: `result()` reads the replies up to its own on the calling
    thread (or waits for the thread that is reading them)."""

    __slots__ = ("_stream", "_op", "_decode")

    def __init__(self, stream: SessionStream, op: Operation, decode: Any) -> None:
        self._stream, self._op, self._decode = stream, op, decode

    def done(self) -> bool:
        """Whether the reply has been read (by any thread)."""
        return self._op.finished

    def result(self) -> Any:
        """The operation's result; raises its error."""
        self._stream.wait(self._op)
        return self._decode(self._op.result())

    def exception(self) -> Optional[errors.Error]:
        """The operation's error, or None."""
        self._stream.wait(self._op)
        return self._op.error


from .graph import Capture  # noqa: E402  (for the annotations above)
