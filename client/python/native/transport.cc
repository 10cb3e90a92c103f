// replayd._transport: a session's Session stream carried by gRPC's C++ library, for the
// Python client's "native" transport (replayd/stream.py, NativeTransport).
//
// The Python client's other transports go through grpcio, whose Cython layer costs
// several microseconds per message and per completion. Here a `Call` is one Session
// stream on a completion queue of its own, driven by whichever Python thread holds the
// stream's read turn (as the C++ client's Stream is): a round trip costs no thread hop, and
// the GIL is released while the thread waits for the daemon. Messages cross as serialized
// bytes, built and parsed by the Python package, except a replay's request and reply,
// which are encoded and decoded here (their field numbers below, checked against the
// protobuf messages by the tests).
//
//   Channel(target, tls=False, root_ca=None, cert=None, key=None, server_name=None,
//           options=())                 a gRPC channel to the daemon
//   Channel.call(method, metadata)      a Call: one bidirectional stream of `method`
//   Call.send(data, with_receive)       starts writing one message; False once the stream
//                                       cannot take it. At most one write is outstanding
//                                       (can_send()); with_receive also arms a receive
//   Call.arm_receive()                  starts reading one message (receive_armed())
//   Call.poll(message_only=False)       waits for one completion: the bytes of a message,
//                                       None (a write or a step of the call completed), or
//                                       raises Ended(code, details) once the stream has
//                                       ended and nothing of it is outstanding; with
//                                       message_only, only a message or the end while a
//                                       read is outstanding
//   Call.send_replay(...), Call.receive_replay(outputs), Call.poll_replay(message_only, outputs)
//                                       a replay's request encoded here, its reply decoded
//                                       here (a ReplayReply), its reads copied into numpy
//                                       arrays
//   encode_replay(...), decode_replay_reply(data, outputs)
//                                       the same encoding, for tests
//   Call.close()                        no more messages will be sent (half close); reads
//                                       on to the stream's end
//   Call.cancel()                       breaks the stream; what is outstanding completes
//
// Thread safety: every method runs with the GIL held except while a thread waits in poll()
// and while a write or read starts; the GIL guards a Call's own state. As grpc++ allows, one
// thread may poll while another sends.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

namespace {

// What a completion of a Call is, given to the completion queue as its tag.
enum Step : intptr_t { kInitial = 1, kWrite, kRead, kWritesDone, kFinish };

void* TagOf(Step s) { return reinterpret_cast<void*>(static_cast<intptr_t>(s)); }

PyObject* ended_error = nullptr;  // replayd._transport.Ended, set when the module loads

// How long a poll waits before it looks for a signal to raise (KeyboardInterrupt).
constexpr std::chrono::milliseconds kSignalCheck(100);

// Bytes, or None, from a Python argument; false (with an exception set) for anything else.
bool OptionalBytes(PyObject* o, const char* what, std::string* out) {
  if (o == nullptr || o == Py_None) return true;
  if (!PyBytes_Check(o)) {
    PyErr_Format(PyExc_TypeError, "%s: bytes or None, not %s", what, Py_TYPE(o)->tp_name);
    return false;
  }
  out->assign(PyBytes_AS_STRING(o), PyBytes_GET_SIZE(o));
  return true;
}

// --- A replay's request and reply on the wire --------------------------------------------
//
// The replay round trip, the one a decode loop repeats, is encoded and decoded here rather
// than through Python's protobuf messages, whose field-by-field building and parsing cost
// more than the rest of the round trip's Python. Field numbers are proto/replayd/v1/
// replayd.proto's (SessionRequest, ReplayGraphRequest, ParamValue, View, SessionReply,
// ReplayGraphReply); tests/python/test_transport.py checks both directions against the
// protobuf messages.

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, int wire_type) { PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }

void PutVarintField(std::string* out, int field, uint64_t v) {
  if (v == 0) return;  // proto3: a zero is not sent
  PutTag(out, field, 0);
  PutVarint(out, v);
}

void PutBytesField(std::string* out, int field, const std::string& bytes) {
  PutTag(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

// A replay's arguments, read from Python.
struct ReplayArgs {
  uint64_t seq = 0;
  uint64_t session = 0;
  bool resume = false;
  uint64_t graph = 0;
  std::vector<std::pair<bool, uint64_t>> params;  // (is a buffer, handle or int64 bits)
  bool wait = false;
  std::vector<std::array<uint64_t, 3>> reads;     // buffer, offset, length
  int with_receive = 1;                           // send_replay: also read the reply
};

// Parses (seq, session, resume, graph, values, kinds, wait, reads[, with_receive]):
// `values` a sequence of ints, `kinds` bytes of b"b" (a buffer handle) or b"i" (an int64)
// per value, `reads` a sequence of (buffer, offset, length).
bool ParseReplayArgs(PyObject* args, ReplayArgs* r) {
  PyObject *values = nullptr, *reads = nullptr;
  Py_buffer kinds;
  int resume = 0, wait = 0;
  if (!PyArg_ParseTuple(args, "KKpKOy*pO|p", &r->seq, &r->session, &resume, &r->graph, &values, &kinds, &wait,
                        &reads, &r->with_receive)) {
    return false;
  }
  r->resume = resume;
  r->wait = wait;
  const std::string kind_bytes(static_cast<const char*>(kinds.buf), static_cast<size_t>(kinds.len));
  PyBuffer_Release(&kinds);
  PyObject* value_seq = PySequence_Fast(values, "values: a sequence of ints");
  if (value_seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(value_seq);
  bool ok = n == static_cast<Py_ssize_t>(kind_bytes.size());
  if (!ok) PyErr_Format(PyExc_ValueError, "%zd values but %zu kinds", n, kind_bytes.size());
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    PyObject* v = PySequence_Fast_GET_ITEM(value_seq, i);
    const char kind = kind_bytes[static_cast<size_t>(i)];
    if (kind == 'b') {
      const unsigned long long handle = PyLong_AsUnsignedLongLong(v);
      ok = !(handle == static_cast<unsigned long long>(-1) && PyErr_Occurred());
      r->params.emplace_back(true, handle);
    } else if (kind == 'i') {
      const long long value = PyLong_AsLongLong(v);
      ok = !(value == -1 && PyErr_Occurred());
      r->params.emplace_back(false, static_cast<uint64_t>(value));
    } else {
      PyErr_Format(PyExc_ValueError, "kind %c: b (a buffer) or i (an integer)", kind);
      ok = false;
    }
  }
  Py_DECREF(value_seq);
  if (!ok) return false;
  PyObject* read_seq = PySequence_Fast(reads, "reads: a sequence of (buffer, offset, length)");
  if (read_seq == nullptr) return false;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(read_seq); ++i) {
    unsigned long long buffer = 0, offset = 0, length = 0;
    PyObject* view = PySequence_Fast_GET_ITEM(read_seq, i);
    ok = PyTuple_Check(view) && PyArg_ParseTuple(view, "KKK", &buffer, &offset, &length);
    if (!ok && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "reads: a sequence of (buffer, offset, length)");
    if (ok) r->reads.push_back({buffer, offset, length});
  }
  Py_DECREF(read_seq);
  return ok;
}

// SessionRequest{seq, session, resume, replay: ReplayGraphRequest{graph, params, wait, reads}}.
std::string EncodeReplay(const ReplayArgs& r) {
  std::string replay, item;
  PutVarintField(&replay, 2, r.graph);
  for (const auto& [is_buffer, value] : r.params) {
    item.clear();
    PutTag(&item, is_buffer ? 1 : 2, 0);  // a oneof member is sent even when zero
    PutVarint(&item, value);
    PutBytesField(&replay, 3, item);
  }
  if (r.wait) PutVarintField(&replay, 4, 1);
  for (const auto& [buffer, offset, length] : r.reads) {
    item.clear();
    PutVarintField(&item, 1, buffer);
    PutVarintField(&item, 2, offset);
    PutVarintField(&item, 3, length);
    PutBytesField(&replay, 5, item);
  }
  std::string request;
  PutVarintField(&request, 1, r.seq);
  if (r.session != 0) {
    PutTag(&request, 2, 1);
    for (int i = 0; i < 8; ++i) request.push_back(static_cast<char>(r.session >> (8 * i)));
  }
  if (r.resume) PutVarintField(&request, 4, 1);
  PutBytesField(&request, 11, replay);
  return request;
}

// A protobuf message's fields, one at a time. False at the end, or (with `error` set) at
// bytes that are not a message.
class WireReader {
 public:
  WireReader(const char* data, size_t size) : p_(data), end_(data + size) {}
  bool Next(int* field, int* wire_type, uint64_t* value, std::string_view* bytes) {
    if (p_ == end_) return false;
    uint64_t key = 0;
    if (!Varint(&key)) return false;
    *field = static_cast<int>(key >> 3);
    *wire_type = static_cast<int>(key & 7);
    switch (*wire_type) {
      case 0:
        return Varint(value);
      case 1:
        return Fixed(8, value);
      case 5:
        return Fixed(4, value);
      case 2: {
        uint64_t n = 0;
        if (!Varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return Fail();
        *bytes = std::string_view(p_, n);
        p_ += n;
        return true;
      }
      default:
        return Fail();
    }
  }
  bool error() const { return error_; }

 private:
  bool Fail() {
    error_ = true;
    return false;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return Fail();
      const uint8_t b = static_cast<uint8_t>(*p_++);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return Fail();
  }
  bool Fixed(int n, uint64_t* v) {
    if (end_ - p_ < n) return Fail();
    *v = 0;
    for (int i = 0; i < n; ++i) *v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_ += n;
    return true;
  }
  const char* p_;
  const char* end_;
  bool error_ = false;
};

// A SessionReply with the fields a replay's final reply has.
struct ReplayReply {
  uint64_t seq = 0;
  int64_t code = 0;
  std::string_view message;
  bool final = false;
  double device_seconds = 0;
  std::vector<std::string_view> reads;
};

// False (with a Python exception set) for bytes that are not such a reply.
bool DecodeReplayReply(std::string_view data, ReplayReply* r) {
  WireReader reply(data.data(), data.size());
  int field = 0, wire_type = 0;
  uint64_t value = 0;
  std::string_view bytes;
  while (reply.Next(&field, &wire_type, &value, &bytes)) {
    if (field == 1 && wire_type == 0) r->seq = value;
    if (field == 2 && wire_type == 0) r->code = static_cast<int32_t>(value);
    if (field == 3 && wire_type == 2) r->message = bytes;
    if (field == 4 && wire_type == 0) r->final = value != 0;
    if (field != 11 || wire_type != 2) continue;
    WireReader replay(bytes.data(), bytes.size());
    std::string_view read;
    while (replay.Next(&field, &wire_type, &value, &read)) {
      if (field == 1 && wire_type == 1) memcpy(&r->device_seconds, &value, sizeof(double));
      if (field == 2 && wire_type == 2) r->reads.push_back(read);
    }
    if (replay.error()) break;
  }
  if (reply.error()) {
    PyErr_SetString(PyExc_ValueError, "the daemon's reply is not a SessionReply");
    return false;
  }
  return true;
}

// Copies a successful reply's reads into `outputs` (writable buffers, one per read, each
// of the read's size). False with a Python exception set where they do not match.
bool FillOutputs(const ReplayReply& r, PyObject* outputs) {
  PyObject* seq = PySequence_Fast(outputs, "outputs: a sequence of writable buffers");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  bool ok = n == static_cast<Py_ssize_t>(r.reads.size());
  if (!ok) PyErr_Format(PyExc_ValueError, "the reply holds %zu reads for %zd outputs", r.reads.size(), n);
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    Py_buffer out;
    if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
      ok = false;
      break;
    }
    const std::string_view read = r.reads[static_cast<size_t>(i)];
    if (static_cast<size_t>(out.len) != read.size()) {
      PyErr_Format(PyExc_ValueError, "read %zd: the daemon answered %zu bytes for an output of %zd", i, read.size(),
                   out.len);
      ok = false;
    } else {
      memcpy(out.buf, read.data(), read.size());
    }
    PyBuffer_Release(&out);
  }
  Py_DECREF(seq);
  return ok;
}

// replayd._transport.ReplayReply: a reply's fields, as a SessionReply's are named.
PyStructSequence_Field kReplyFields[] = {{"seq", nullptr},     {"code", nullptr},           {"message", nullptr},
                                         {"final", nullptr},   {"device_seconds", nullptr}, {nullptr, nullptr}};
PyStructSequence_Desc kReplyDesc = {"replayd._transport.ReplayReply",
                                    "A replay's reply: (seq, code, message, final, device_seconds).", kReplyFields,
                                    5};
PyTypeObject* reply_type = nullptr;  // set when the module loads

// The ReplayReply of a reply, its reads copied into `outputs` when it succeeded.
PyObject* ReplayResult(std::string_view data, PyObject* outputs) {
  ReplayReply r;
  if (!DecodeReplayReply(data, &r)) return nullptr;
  if (r.code == 0 && r.final && !FillOutputs(r, outputs)) return nullptr;
  PyObject* result = PyStructSequence_New(reply_type);
  if (result == nullptr) return nullptr;
  PyObject* fields[] = {PyLong_FromUnsignedLongLong(r.seq), PyLong_FromLongLong(r.code),
                        PyUnicode_DecodeUTF8(r.message.data(), static_cast<Py_ssize_t>(r.message.size()), "replace"),
                        PyBool_FromLong(r.final), PyFloat_FromDouble(r.device_seconds)};
  for (int i = 0; i < 5; ++i) {
    if (fields[i] == nullptr) {
      for (int j = i + 1; j < 5; ++j) Py_XDECREF(fields[j]);
      Py_DECREF(result);  // frees the fields set so far
      return nullptr;
    }
    PyStructSequence_SetItem(result, i, fields[i]);
  }
  return result;
}

PyObject* EncodeReplayFunction(PyObject*, PyObject* args) {
  ReplayArgs r;
  if (!ParseReplayArgs(args, &r)) return nullptr;
  const std::string request = EncodeReplay(r);
  return PyBytes_FromStringAndSize(request.data(), static_cast<Py_ssize_t>(request.size()));
}

PyObject* DecodeReplayFunction(PyObject*, PyObject* args) {
  Py_buffer data;
  PyObject* outputs = nullptr;
  if (!PyArg_ParseTuple(args, "y*O", &data, &outputs)) return nullptr;
  PyObject* result = ReplayResult(std::string_view(static_cast<const char*>(data.buf), data.len), outputs);
  PyBuffer_Release(&data);
  return result;
}

// --- Channel -------------------------------------------------------------------------------

struct ChannelObject {
  PyObject_HEAD
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
};

// `options`: (name, int or str) pairs, as grpcio takes them.
bool SetOptions(PyObject* options, grpc::ChannelArguments* args) {
  if (options == nullptr || options == Py_None) return true;
  PyObject* seq = PySequence_Fast(options, "options: a sequence of (name, value) pairs");
  if (seq == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
    const char* name = nullptr;
    PyObject* value = nullptr;
    if (!PyTuple_Check(pair) || !PyArg_ParseTuple(pair, "sO", &name, &value)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "options: a sequence of (name, value) pairs");
      Py_DECREF(seq);
      return false;
    }
    if (PyLong_Check(value)) {
      const long v = PyLong_AsLong(value);
      if (v == -1 && PyErr_Occurred()) break;
      if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "option %s: %ld is not a 32-bit integer", name, v);
        break;
      }
      args->SetInt(name, static_cast<int>(v));
    } else if (PyUnicode_Check(value)) {
      const char* s = PyUnicode_AsUTF8(value);
      if (s == nullptr) break;
      args->SetString(name, s);
    } else {
      PyErr_Format(PyExc_TypeError, "option %s: an int or a str, not %s", name, Py_TYPE(value)->tp_name);
      break;
    }
  }
  Py_DECREF(seq);
  return !PyErr_Occurred();
}

int ChannelInit(ChannelObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kKeywords[] = {"target", "tls", "root_ca", "cert", "key", "server_name", "options", nullptr};
  const char* target = nullptr;
  int tls = 0;
  PyObject *root_ca = nullptr, *cert = nullptr, *key = nullptr, *options = nullptr;
  const char* server_name = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|pOOOzO", const_cast<char**>(kKeywords), &target, &tls,
                                   &root_ca, &cert, &key, &server_name, &options)) {
    return -1;
  }
  grpc::ChannelArguments channel_args;
  if (!SetOptions(options, &channel_args)) return -1;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (!OptionalBytes(root_ca, "root_ca", &ssl.pem_root_certs) ||
        !OptionalBytes(cert, "cert", &ssl.pem_cert_chain) || !OptionalBytes(key, "key", &ssl.pem_private_key)) {
      return -1;
    }
    if (server_name != nullptr && *server_name != '\0') channel_args.SetSslTargetNameOverride(server_name);
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  self->channel = grpc::CreateCustomChannel(target, credentials, channel_args);
  self->stub = std::make_unique<grpc::GenericStub>(self->channel);
  return 0;
}

PyObject* ChannelNew(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<ChannelObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  new (&self->channel) std::shared_ptr<grpc::Channel>();
  new (&self->stub) std::unique_ptr<grpc::GenericStub>();
  return reinterpret_cast<PyObject*>(self);
}

void ChannelDealloc(ChannelObject* self) {
  self->stub.~unique_ptr();
  self->channel.~shared_ptr();
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// --- Call ----------------------------------------------------------------------------------

// One stream. grpc++ forbids two batches that both receive the initial metadata, which a
// first Read and a Finish started together would be; so the initial metadata is read
// first, and the Finish (the stream's status) only once a read or a write has found the
// stream ended, as grpc++'s asynchronous API expects.
struct CallState {
  std::shared_ptr<grpc::Channel> channel;  // outlives the call
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream;
  grpc::ByteBuffer received;
  grpc::Status status;
  int outstanding = 0;            // started and not yet completed
  bool initial = false;           // the initial metadata has been read (or the call ended)
  bool writing = false;           // a write is outstanding
  bool reading = false;           // a read is outstanding, or wanted once `initial`
  bool read_started = false;      // the wanted read has been started
  bool closed = false;            // half closed, or cancelled: nothing more is sent
  bool broken = false;            // a write or a read found the stream ended
  bool finishing = false;         // Finish has been started
  bool finished = false;          // Finish completed: `status` holds the stream's status

  void Start() { ++outstanding; }
  // Wants the next message read (unless a read is wanted already) and starts what can be.
  void WantRead() {
    if (!reading) {
      reading = true;
      read_started = false;
    }
    Advance();
  }
  // Starts the wanted read, and the Finish once the stream is known to have ended.
  void Advance() {
    if (!initial) return;
    if (reading && !read_started && !broken) {
      read_started = true;
      Start();
      stream->Read(&received, TagOf(kRead));
    }
    if (broken && !finishing && !writing && !(reading && read_started)) {
      finishing = true;
      Start();
      stream->Finish(&status, TagOf(kFinish));
    }
  }
};

struct CallObject {
  PyObject_HEAD
  CallState* state;
  PyObject* channel;  // the ChannelObject, kept alive
};

PyObject* CallCanSend(CallObject* self, PyObject*) {
  CallState& c = *self->state;
  return PyBool_FromLong(!c.writing);
}

PyObject* CallReceiveArmed(CallObject* self, PyObject*) { return PyBool_FromLong(self->state->reading); }

PyObject* CallArmReceive(CallObject* self, PyObject*) {
  CallState& c = *self->state;
  if (!c.broken) c.WantRead();
  Py_RETURN_NONE;
}

// Starts writing `size` bytes at `data` (and reading the reply with `with_receive`):
// True, False once the stream cannot take it, nullptr with an exception set.
PyObject* StartSend(CallState& c, const void* data, size_t size, bool with_receive) {
  if (c.broken || c.closed || c.finishing) Py_RETURN_FALSE;
  if (c.writing) {
    PyErr_SetString(PyExc_RuntimeError, "a write is outstanding: wait for can_send()");
    return nullptr;
  }
  grpc::Slice slice(data, size);
  grpc::ByteBuffer message(&slice, 1);
  c.writing = true;
  c.Start();
  Py_BEGIN_ALLOW_THREADS
  c.stream->Write(message, TagOf(kWrite));
  Py_END_ALLOW_THREADS
  if (with_receive) c.WantRead();
  Py_RETURN_TRUE;
}

PyObject* CallSend(CallObject* self, PyObject* args) {
  Py_buffer data;
  int with_receive = 0;
  if (!PyArg_ParseTuple(args, "y*|p", &data, &with_receive)) return nullptr;
  PyObject* result = StartSend(*self->state, data.buf, static_cast<size_t>(data.len), with_receive);
  PyBuffer_Release(&data);
  return result;
}

PyObject* CallSendReplay(CallObject* self, PyObject* args) {
  ReplayArgs r;
  if (!ParseReplayArgs(args, &r)) return nullptr;
  const std::string request = EncodeReplay(r);
  return StartSend(*self->state, request.data(), request.size(), r.with_receive != 0);
}

// Raises Ended(code, details).
PyObject* RaiseEnded(const grpc::Status& status) {
  PyObject* value = Py_BuildValue("(is#)", static_cast<int>(status.error_code()), status.error_message().data(),
                                  static_cast<Py_ssize_t>(status.error_message().size()));
  if (value != nullptr) {
    PyErr_SetObject(ended_error, value);
    Py_DECREF(value);
  }
  return nullptr;
}

// One completion of the call: a message's bytes (a new reference), nullptr with an
// exception set (Ended once the stream has ended and nothing is outstanding), or None.
PyObject* PollOnce(CallState& c) {
  if (c.outstanding == 0) {
    if (c.finished) return RaiseEnded(c.status);
    PyErr_SetString(PyExc_RuntimeError, "poll with nothing outstanding");
    return nullptr;
  }
  void* tag = nullptr;
  bool ok = false;
  grpc::CompletionQueue::NextStatus got = grpc::CompletionQueue::TIMEOUT;
  for (;;) {
    // Waits in slices, so that a signal (Ctrl-C) is seen while the daemon takes its time;
    // what is outstanding stays outstanding for the next poll.
    Py_BEGIN_ALLOW_THREADS
    got = c.queue.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + kSignalCheck);
    Py_END_ALLOW_THREADS
    if (got != grpc::CompletionQueue::TIMEOUT) break;
    if (PyErr_CheckSignals() < 0) return nullptr;
  }
  if (got == grpc::CompletionQueue::SHUTDOWN) {  // only after the call has ended
    c.outstanding = 0;
    return RaiseEnded(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the session stream ended"));
  }
  --c.outstanding;
  PyObject* result = nullptr;
  switch (static_cast<Step>(reinterpret_cast<intptr_t>(tag))) {
    case kInitial:
      c.initial = true;
      if (!ok) c.broken = true;
      break;
    case kWrite:
      c.writing = false;
      if (!ok) c.broken = true;
      break;
    case kRead:
      c.reading = false;
      c.read_started = false;
      if (!ok) {
        c.broken = true;
        break;
      }
      {
        std::vector<grpc::Slice> slices;
        if (!c.received.Dump(&slices).ok()) {
          c.broken = true;
          break;
        }
        size_t size = 0;
        for (const grpc::Slice& s : slices) size += s.size();
        result = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
        if (result == nullptr) return nullptr;
        char* out = PyBytes_AS_STRING(result);
        for (const grpc::Slice& s : slices) {
          memcpy(out, s.begin(), s.size());
          out += s.size();
        }
        c.received.Clear();
      }
      break;
    case kWritesDone:
      break;
    case kFinish:
      c.finished = true;
      break;
  }
  c.Advance();
  if (result != nullptr) return result;
  if (c.finished && c.outstanding == 0) return RaiseEnded(c.status);
  Py_RETURN_NONE;
}

// How long Poll waits: for one completion; past other completions while a read is
// outstanding (message_only); or for a message, whatever else completes first.
enum class Wait { kOne, kWhileReading, kForMessage };

// Completions of the call until one that `wait` returns on: a message's bytes (with
// `outputs`, its ReplayReply, its reads copied into them), or None; nullptr with an
// exception set (Ended once the stream has ended and nothing of it is outstanding).
PyObject* Poll(CallState& c, Wait wait, PyObject* outputs) {
  for (;;) {
    PyObject* message = PollOnce(c);
    if (message == nullptr) return nullptr;
    if (message != Py_None) {
      if (outputs == nullptr) return message;
      PyObject* result =
          ReplayResult(std::string_view(PyBytes_AS_STRING(message), PyBytes_GET_SIZE(message)), outputs);
      Py_DECREF(message);
      return result;
    }
    if (wait == Wait::kOne || (wait == Wait::kWhileReading && !c.reading)) return message;
    Py_DECREF(message);
  }
}

// With `message_only`, completions other than a message's (a write's, the initial
// metadata's) are taken here while a read is outstanding, saving the caller a return
// per round trip.
PyObject* CallPoll(CallObject* self, PyObject* args) {
  int message_only = 0;
  if (!PyArg_ParseTuple(args, "|p", &message_only)) return nullptr;
  return Poll(*self->state, message_only ? Wait::kWhileReading : Wait::kOne, nullptr);
}

// poll(), with a message decoded as a replay's reply: its ReplayReply, its reads copied
// into `outputs`.
PyObject* CallPollReplay(CallObject* self, PyObject* args) {
  int message_only = 0;
  PyObject* outputs = nullptr;
  if (!PyArg_ParseTuple(args, "pO", &message_only, &outputs)) return nullptr;
  return Poll(*self->state, message_only ? Wait::kWhileReading : Wait::kOne, outputs);
}

// Waits for the next message, the reply of a replay sent with send_replay, and returns
// decode_replay_reply's ReplayReply for it. Raises Ended as poll does.
PyObject* CallReceiveReplay(CallObject* self, PyObject* args) {
  PyObject* outputs = nullptr;
  if (!PyArg_ParseTuple(args, "O", &outputs)) return nullptr;
  return Poll(*self->state, Wait::kForMessage, outputs);
}

PyObject* CallClose(CallObject* self, PyObject*) {
  CallState& c = *self->state;
  if (c.closed) Py_RETURN_NONE;
  c.closed = true;
  if (!c.broken) {
    if (c.writing) {
      PyErr_SetString(PyExc_RuntimeError, "a write is outstanding: wait for can_send()");
      return nullptr;
    }
    c.Start();
    c.stream->WritesDone(TagOf(kWritesDone));
  }
  // A read sees the end of the stream, which starts the Finish.
  c.WantRead();
  Py_RETURN_NONE;
}

PyObject* CallCancel(CallObject* self, PyObject*) {
  CallState& c = *self->state;
  c.closed = true;
  c.context.TryCancel();
  Py_RETURN_NONE;
}

// Cancels the call and waits, without the GIL, for what it has outstanding: the queue may
// only be destroyed drained.
void CallDealloc(CallObject* self) {
  CallState* c = self->state;
  if (c != nullptr) {
    Py_BEGIN_ALLOW_THREADS
    if (c->outstanding > 0) c->context.TryCancel();
    void* tag = nullptr;
    bool ok = false;
    while (c->outstanding > 0 && c->queue.Next(&tag, &ok)) --c->outstanding;
    c->queue.Shutdown();
    while (c->queue.Next(&tag, &ok)) {
    }
    c->stream.reset();
    delete c;
    Py_END_ALLOW_THREADS
  }
  Py_XDECREF(self->channel);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMethodDef kCallMethods[] = {
    {"can_send", reinterpret_cast<PyCFunction>(CallCanSend), METH_NOARGS,
     "Whether a message may be sent now: no write is outstanding."},
    {"receive_armed", reinterpret_cast<PyCFunction>(CallReceiveArmed), METH_NOARGS,
     "Whether a read is outstanding."},
    {"arm_receive", reinterpret_cast<PyCFunction>(CallArmReceive), METH_NOARGS,
     "Starts reading the next message, unless a read is outstanding or the stream has ended."},
    {"send", reinterpret_cast<PyCFunction>(CallSend), METH_VARARGS,
     "send(data, with_receive=False) -> bool: starts writing one message (and reading the "
     "next with with_receive); False once the stream cannot take it."},
    {"poll", reinterpret_cast<PyCFunction>(CallPoll), METH_VARARGS,
     "poll(message_only=False): waits for one completion: a message's bytes, or None; raises "
     "Ended(code, details) once the stream has ended and nothing of it is outstanding. With "
     "message_only, waits on past other completions while a read is outstanding."},
    {"send_replay", reinterpret_cast<PyCFunction>(CallSendReplay), METH_VARARGS,
     "send_replay(seq, session, resume, graph, values, kinds, wait, reads, with_receive=True) "
     "-> bool: send() of encode_replay's request."},
    {"poll_replay", reinterpret_cast<PyCFunction>(CallPollReplay), METH_VARARGS,
     "poll_replay(message_only, outputs) -> ReplayReply or None: poll(), a message decoded as "
     "a replay's reply, its reads copied into `outputs` when it succeeded."},
    {"receive_replay", reinterpret_cast<PyCFunction>(CallReceiveReplay), METH_VARARGS,
     "receive_replay(outputs) -> ReplayReply: waits for the next "
     "message, a replay's reply, and decodes it as decode_replay_reply does; raises Ended as "
     "poll does."},
    {"close", reinterpret_cast<PyCFunction>(CallClose), METH_NOARGS,
     "Half closes the stream (nothing more will be sent) and reads on to its end, which "
     "poll() then raises."},
    {"cancel", reinterpret_cast<PyCFunction>(CallCancel), METH_NOARGS,
     "Breaks the stream; what is outstanding completes, failed."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject call_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* ChannelCall(ChannelObject* self, PyObject* args) {
  const char* method = nullptr;
  PyObject* metadata = nullptr;
  if (!PyArg_ParseTuple(args, "sO", &method, &metadata)) return nullptr;
  if (self->stub == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "the channel was not initialized");
    return nullptr;
  }
  auto state = std::make_unique<CallState>();
  if (metadata != Py_None) {
    PyObject* seq = PySequence_Fast(metadata, "metadata: a sequence of (key, value) pairs");
    if (seq == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
      const char *key = nullptr, *value = nullptr;
      PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
      if (!PyTuple_Check(pair) || !PyArg_ParseTuple(pair, "ss", &key, &value)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "metadata: a sequence of (key, value) pairs");
        Py_DECREF(seq);
        return nullptr;
      }
      state->context.AddMetadata(key, value);
    }
    Py_DECREF(seq);
  }
  auto* call = PyObject_New(CallObject, &call_type);
  if (call == nullptr) return nullptr;
  state->channel = self->channel;
  state->stream = self->stub->PrepareCall(&state->context, method, &state->queue);
  // The call's initial metadata goes out with its first message, in one batch (StartCall
  // starts nothing when it is corked). The daemon's is read at once: it comes with the
  // first reply, or with the stream's status.
  state->context.set_initial_metadata_corked(true);
  state->stream->StartCall(nullptr);
  state->Start();
  state->stream->ReadInitialMetadata(TagOf(kInitial));
  call->state = state.release();
  Py_INCREF(self);
  call->channel = reinterpret_cast<PyObject*>(self);
  return reinterpret_cast<PyObject*>(call);
}

PyMethodDef kChannelMethods[] = {
    {"call", reinterpret_cast<PyCFunction>(ChannelCall), METH_VARARGS,
     "call(method, metadata) -> Call: starts one bidirectional stream of `method` "
     "(\"/package.Service/Method\") with `metadata`, a sequence of (key, value) or None."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject channel_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef kModuleMethods[] = {
    {"encode_replay", EncodeReplayFunction, METH_VARARGS,
     "encode_replay(seq, session, resume, graph, values, kinds, wait, reads) -> bytes: a "
     "SessionRequest replaying `graph`: `values` its parameter vector, `kinds` b'b' (a buffer "
     "handle) or b'i' (an integer) per value, `reads` (buffer, offset, length) views."},
    {"decode_replay_reply", DecodeReplayFunction, METH_VARARGS,
     "decode_replay_reply(data, outputs) -> ReplayReply (seq, code, message, final, "
     "device_seconds): a SessionReply's fields; a final reply's reads are copied into `outputs` "
     "(writable buffers of each read's size) when its code is 0."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_transport",
                          "A session's Session stream carried by gRPC's C++ library (the native transport).",
                          -1, kModuleMethods};

}  // namespace

PyMODINIT_FUNC PyInit__transport() {
  channel_type.tp_name = "replayd._transport.Channel";
  channel_type.tp_basicsize = sizeof(ChannelObject);
  channel_type.tp_flags = Py_TPFLAGS_DEFAULT;
  channel_type.tp_doc = "Channel(target, tls=False, root_ca=None, cert=None, key=None, server_name=None, options=())";
  channel_type.tp_new = ChannelNew;
  channel_type.tp_init = reinterpret_cast<initproc>(ChannelInit);
  channel_type.tp_dealloc = reinterpret_cast<destructor>(ChannelDealloc);
  channel_type.tp_methods = kChannelMethods;
  call_type.tp_name = "replayd._transport.Call";
  call_type.tp_basicsize = sizeof(CallObject);
  call_type.tp_flags = Py_TPFLAGS_DEFAULT;
  call_type.tp_doc = "One bidirectional stream; made by Channel.call.";
  call_type.tp_dealloc = reinterpret_cast<destructor>(CallDealloc);
  call_type.tp_methods = kCallMethods;
  if (PyType_Ready(&channel_type) < 0 || PyType_Ready(&call_type) < 0) return nullptr;
  reply_type = PyStructSequence_NewType(&kReplyDesc);
  if (reply_type == nullptr) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  ended_error = PyErr_NewExceptionWithDoc("replayd._transport.Ended",
                                          "The stream has ended: args are (code, details), code 0 for a clean end.",
                                          nullptr, nullptr);
  Py_INCREF(&channel_type);
  Py_INCREF(&call_type);
  if (ended_error == nullptr || PyModule_AddObject(module, "Channel", reinterpret_cast<PyObject*>(&channel_type)) < 0 ||
      PyModule_AddObject(module, "Call", reinterpret_cast<PyObject*>(&call_type)) < 0 ||
      PyModule_AddObject(module, "Ended", ended_error) < 0 ||
      PyModule_AddObject(module, "ReplayReply", reinterpret_cast<PyObject*>(reply_type)) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
