// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// Streams are served on a completion queue of their own, polled by `threads` threads
// (the unary RPCs stay on gRPC's sync server). A request is run by the thread that
// received it, so a round trip pays no thread hop: the poller that read the bytes runs
// the operation and starts the reply's write. Two things must not hold a polling thread,
// or one client could stall every other stream: a replay sequence (long, and its
// streamed reads wait for the client to take them) and a request that comes while all
// but one of the threads are running operations (so one thread always polls). Those go
// to a worker of a pool that grows with the streams needing one (`WorkerPool`). Either
// way one operation of a stream runs at a time, in the order read.
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

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "replayd/v1/replayd.grpc.pb.h"
#include "server/authenticator.h"
#include "server/worker_pool.h"

namespace replayd {

// The Replayd service with Session served on a completion queue, the rest synchronously.
using SessionStreamService = v1::Replayd::WithAsyncMethod_Session<v1::Replayd::Service>;

struct SessionStreamOptions {
  size_t window = 8;  // unanswered operations per stream read ahead; see above
  int threads = 2;    // threads polling the streams' completion queue; at least 2
};

class SessionStream;

// Serves the Session method of a service. Thread safety: Start and Stop from one thread.
class SessionStreamServer {
 public:
  // Adds the streams' completion queue to `builder`: construct before BuildAndStart, then
  // Start. `engine`, `auth` and `service` (registered with the builder) must outlive this.
  SessionStreamServer(Engine& engine, const Authenticator& auth, SessionStreamService& service,
                      SessionStreamOptions options, grpc::ServerBuilder& builder);
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
  friend class SessionStream;

  // Waits for the next stream, unless stopping.
  void Accept();
  void Ended();
  void Poll();
  // An inline slot lets a polling thread run an operation; there is one fewer than there
  // are threads. False when none is free.
  bool TakeInlineSlot();
  void ReleaseInlineSlot() { inline_free_.fetch_add(1, std::memory_order_release); }

  Engine& engine_;
  const Authenticator& auth_;
  SessionStreamService& service_;
  const SessionStreamOptions options_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::vector<std::thread> threads_;
  std::atomic<int> inline_free_;
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;  // streams, counting the one waiting for a call
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ = false;
  // Declared last, so destroyed first: the workers end before what they use.
  WorkerPool pool_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_SESSION_STREAM_H_
