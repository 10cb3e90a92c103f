// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// Streams are served on a completion queue of their own (queued_call.h), polled by
// `threads` threads, and so are the short unary calls (see SessionStreamService), each
// answered by the service's own handler for its method. Every thread polling gRPC takes
// part in its hand-over of polling between threads and so slows every call of the daemon,
// while a call left on the sync server pays a thread hop: one polling thread is the
// default. Where a received request runs, on the polling thread or on a worker, is the
// Dispatcher's to say (dispatch.h); either way one operation of a stream runs at a time,
// in the order read. A request whose worker is refused fails with RESOURCE_EXHAUSTED, and
// the stream's requests queued behind it fail as after any failed operation.
//
// A request whose bytes do not parse as a SessionRequest ends the reading, as the client's
// half-close would: what was read before it runs and is answered, then the stream finishes
// with INVALID_ARGUMENT naming the method and the message type (it has no seq to answer).
//
// Flow control: a stream reads ahead while fewer than `window` of its operations are
// unanswered (read, reply not yet written), so receiving overlaps execution; past it the
// daemon stops reading and the client's transport pushes back. Windows 0 and 1 both read
// the next request only after the previous reply has been written. Replies are written
// one at a time in order; a reply written while more are due carries a buffer hint, so
// the transport may send a burst in one write. A sequence's streamed replies wait while
// `window` replies are unsent: a client that stops reading stops only its own sequence.
//
// Requests and replies are messages the stream recycles: in the steady state an
// operation allocates no message (a message that held more than 64 KiB is freed instead).
// A stream that breaks (cancel, deadline, client gone) runs nothing of what it had
// queued once the daemon learns of it; the operation running then completes.
#ifndef REPLAYD_SERVER_SESSION_STREAM_H_
#define REPLAYD_SERVER_SESSION_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <thread>
#include <vector>

#include "engine/engine.h"
#include "replayd/v1/replayd.grpc.pb.h"
#include "server/authenticator.h"
#include "server/buffer_upload.h"
#include "server/daemon_metrics.h"
#include "server/dispatch.h"
#include "server/queued_call.h"
#include "server/request_parsing.h"

namespace replayd {

// The Replayd service with Session, the short unary methods and WriteBuffer served on a
// completion queue (SessionStreamServer), and the others (ListDevices, OpenSession,
// CloseSession, LoadProgram with its compile, the ReadBuffer transfer) on gRPC's sync
// server.
// clang-format off
using SessionStreamMethods =
    v1::Replayd::WithAsyncMethod_Session<
    v1::Replayd::WithAsyncMethod_ReplayGraph<
    v1::Replayd::WithAsyncMethod_Launch<
    v1::Replayd::WithAsyncMethod_KeepAlive<
    v1::Replayd::WithAsyncMethod_AllocBuffer<
    v1::Replayd::WithAsyncMethod_FreeBuffer<
    v1::Replayd::WithAsyncMethod_FreeProgram<
    v1::Replayd::WithAsyncMethod_CopyBuffer<
    v1::Replayd::WithAsyncMethod_Synchronize<
    v1::Replayd::WithAsyncMethod_BeginCapture<
    v1::Replayd::WithAsyncMethod_EndCapture<
    v1::Replayd::WithAsyncMethod_DefineGraph<
    v1::Replayd::WithAsyncMethod_FreeGraph<
    v1::Replayd::WithAsyncMethod_GraphInfo<
    v1::Replayd::WithAsyncMethod_WriteBuffer<
    v1::Replayd::Service>>>>>>>>>>>>>>>;
// clang-format on
// Their calls are asked for here rather than through the generated Request<Method>, with
// the requests arriving as ReceivedRequests (request_parsing.h): one that does not parse
// reaches the daemon, which answers it.
class SessionStreamService : public SessionStreamMethods {
 public:
  // Asks for the next call of the unary `method` of this service.
  void RequestUnary(const google::protobuf::MethodDescriptor& method, grpc::ServerContext* context,
                    ReceivedRequest* request, grpc::internal::ServerAsyncStreamingInterface* responder,
                    grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncUnary(method.index(), context, request, responder, cq, cq, tag);
  }
  // Asks for the next call of the client-streaming `method` of this service.
  void RequestClientStream(const google::protobuf::MethodDescriptor& method, grpc::ServerContext* context,
                           grpc::internal::ServerAsyncStreamingInterface* reader, grpc::ServerCompletionQueue* cq,
                           void* tag) {
    RequestAsyncClientStreaming(method.index(), context, reader, cq, cq, tag);
  }
  // Asks for the next call of the bidirectional streaming `method` of this service.
  void RequestBidiStream(const google::protobuf::MethodDescriptor& method, grpc::ServerContext* context,
                         grpc::internal::ServerAsyncStreamingInterface* stream, grpc::ServerCompletionQueue* cq,
                         void* tag) {
    RequestAsyncBidiStreaming(method.index(), context, stream, cq, cq, tag);
  }
};

// Whether `path` ("/replayd.v1.Replayd/ReplayGraph") is a method SessionStreamServer serves,
// whose requests therefore arrive as ReceivedRequests.
bool ServedOnQueue(absl::string_view path);

struct SessionStreamOptions {
  size_t window = 8;      // unanswered operations per stream read ahead; see above
  int threads = 1;        // threads polling the streams' completion queue (and running requests)
  size_t workers = 1024;  // most operations running on workers at once; past it they are refused
  // Most of those one tenant's operations may hold, so that no tenant can take them all.
  size_t workers_per_tenant = 256;
};

// Serves the methods of SessionStreamService marked async: the polling threads, the
// queue's calls and the Dispatcher that places their operations. Thread safety: Start and
// Stop from one thread.
class SessionStreamServer {
 public:
  // Adds the streams' completion queue to `builder`: construct before BuildAndStart, then
  // Start. `engine`, `auth`, `service` (registered with the builder) and `metrics` must
  // outlive this.
  SessionStreamServer(Engine& engine, const Authenticator& auth, SessionStreamService& service,
                      DaemonMetrics& metrics, SessionStreamOptions options, grpc::ServerBuilder& builder);
  // Stops, if Stop was not called.
  ~SessionStreamServer();
  SessionStreamServer(const SessionStreamServer&) = delete;
  SessionStreamServer& operator=(const SessionStreamServer&) = delete;

  // Starts the polling threads and accepts streams; once, after the server has started.
  void Start();
  // After the server's Shutdown has returned (every call has ended or been cancelled):
  // waits for the operations still running, then stops the threads. Idempotent.
  void Stop();

 private:
  Engine& engine_;
  const Authenticator& auth_;
  SessionStreamService& service_;
  DaemonMetrics& metrics_;
  const SessionStreamOptions options_;  // every field at least 1
  CallQueue calls_;
  const BufferUpload::Env upload_env_;  // what WriteBuffer's calls use
  std::vector<std::thread> threads_;  // polling calls_
  bool stopped_ = false;
  // Declared last, so destroyed first: its workers end before what they use.
  Dispatcher dispatcher_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_SESSION_STREAM_H_
