// The Session stream: one session's operations, in order, on one bidirectional stream.
// Each request runs through the same engine operation as its unary RPC; the stream is a
// transport, not a second implementation.
//
// Streams are served on a completion queue of their own, polled by `threads` threads, and
// so are the short unary calls (see SessionStreamService), each answered by the service's
// own handler for its method. A request is run by the thread that received it, so a
// round trip pays no thread hop: the poller that read the bytes runs the operation and
// starts the reply's write. Every thread polling gRPC takes part in its hand-over of
// polling, so each one costs every call of the daemon a few microseconds on a small
// machine, and one left on the sync server a hop (unary ReplayGraph took 53.6 us there
// against 46.8 us served here; DefineGraph 2.4x an empty RPC against 2.0x); one polling
// thread is the default. Two things must not hold the
// polling threads, or one client could stall every other stream: a replay sequence
// (long, and its streamed reads wait for the client to take them) goes to a worker of a
// pool that grows with the streams needing one (`WorkerPool`, at most `workers` threads,
// `workers_per_tenant` of them for one tenant's operations: past a limit a request that
// needs one is refused with RESOURCE_EXHAUSTED, and a stream's requests queued behind it
// fail as after any failed operation); and when every polling
// thread has been running an operation for `kStall`, a standby thread polls in their
// place until one is free, and what it receives goes to a worker. The standby checks
// every `kStall` while operations run and sleeps while the daemon is idle. A request also
// goes to a worker unless the daemon is quiet (see Quiet), so that a busy daemon's
// requests run side by side and meet in the device scheduler, which can only be fair
// between requests that wait in it (run one after another on the polling thread, a heavy
// and a light tenant got equal device time). Either way one operation of a stream runs at
// a time, in the order read.
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
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "replayd/v1/replayd.grpc.pb.h"
#include "server/authenticator.h"
#include "server/worker_pool.h"

namespace replayd {

// The Replayd service with Session and the short unary methods served on a completion
// queue (SessionStreamServer), and the others (ListDevices, OpenSession, CloseSession,
// LoadProgram with its compile, the WriteBuffer and ReadBuffer transfers) on gRPC's sync
// server.
// clang-format off
using SessionStreamService =
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
    v1::Replayd::Service>>>>>>>>>>>>>>;
// clang-format on

struct SessionStreamOptions {
  size_t window = 8;      // unanswered operations per stream read ahead; see above
  int threads = 1;        // threads polling the streams' completion queue (and running requests)
  size_t workers = 1024;  // most operations running on workers at once; past it they are refused
  // Most of those one tenant's operations may hold, so that no tenant can take them all.
  size_t workers_per_tenant = 256;
};

class QueuedCall;
class SessionStream;
template <typename RequestMessage, typename ReplyMessage>
class UnaryCall;

// Serves the methods of SessionStreamService marked async. Thread safety: Start and Stop
// from one thread.
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
  template <typename RequestMessage, typename ReplyMessage>
  friend class UnaryCall;

  // How long every polling thread may be busy before the standby thread polls.
  static constexpr absl::Duration kStall = absl::Milliseconds(2);
  // With nothing run inline for this long, the standby thread sleeps until something is.
  static constexpr int64_t kIdleNs = 1'000'000'000;
  // After a request went to a worker, requests keep going to workers for this long.
  static constexpr int64_t kBusyNs = 10'000'000;

  // Waits for the next call of `call`'s method, unless stopping (then deletes it).
  void Listen(QueuedCall* call);
  // Serves a unary method on the queue: `request` is the service's Request<Method>, `handler`
  // its synchronous handler, which answers each call.
  template <typename RequestMessage, typename ReplyMessage, typename AsyncBase>
  void ServeUnary(void (AsyncBase::*request)(grpc::ServerContext*, RequestMessage*,
                                             grpc::ServerAsyncResponseWriter<ReplyMessage>*, grpc::CompletionQueue*,
                                             grpc::ServerCompletionQueue*, void*),
                  grpc::Status (v1::Replayd::Service::*handler)(grpc::ServerContext*, const RequestMessage*,
                                                                ReplyMessage*));
  void Ended();
  void Poll();
  void Standby();
  void Dispatch(void* tag, bool ok);
  // An inline slot lets a thread that received a request run it: one per polling thread.
  // False when none is free.
  bool TakeInlineSlot();
  // True when no operation runs and none went to a worker in the last kBusyNs: a request
  // may run on the polling thread without passing other streams' requests by.
  bool Quiet();
  void ReleaseInlineSlot();
  // True when the calling polling thread may run an operation now (Quiet and a slot
  // taken; release it after); false when it goes to a worker.
  bool RunHere() { return Quiet() && TakeInlineSlot(); }
  // Runs `task`, an operation of `tenant`, on a worker; requests go to workers for kBusyNs
  // after. RESOURCE_EXHAUSTED, and `task` dropped unrun, when `workers` are all busy or
  // the tenant's operations hold `workers_per_tenant` of them.
  absl::Status HandOff(const std::string& tenant, std::function<void()> task);
  void ReleaseWorker(const std::string& tenant);
  // Counts an operation as running while it lives.
  class RunningOperation {
   public:
    explicit RunningOperation(SessionStreamServer& server) : server_(server) {
      server_.running_.fetch_add(1, std::memory_order_acq_rel);
    }
    ~RunningOperation() { server_.running_.fetch_sub(1, std::memory_order_acq_rel); }
    RunningOperation(const RunningOperation&) = delete;
    RunningOperation& operator=(const RunningOperation&) = delete;

   private:
    SessionStreamServer& server_;
  };

  Engine& engine_;
  const Authenticator& auth_;
  SessionStreamService& service_;
  const SessionStreamOptions options_;  // every field at least 1
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::vector<std::thread> threads_;
  std::thread standby_;
  std::atomic<int> inline_free_;
  std::atomic<int64_t> last_inline_ns_{0};      // when an operation last started inline
  std::atomic<int64_t> saturated_since_ns_{0};  // when the last inline slot was taken; 0: one is free
  std::atomic<bool> standby_asleep_{false};
  std::atomic<int> running_{0};  // operations running, on any thread
  std::atomic<int64_t> last_handoff_ns_{0};
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;  // calls, counting those waiting to be called
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ = false;
  absl::Mutex workers_mu_;
  absl::flat_hash_map<std::string, size_t> tenant_workers_ ABSL_GUARDED_BY(workers_mu_);  // only above 0
  // Declared last, so destroyed first: the workers end before what they use.
  WorkerPool pool_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_SESSION_STREAM_H_
