// Where an operation received on the completion queue runs (a Session stream's request or
// a unary call, see session_stream.h): on the polling thread that received it, or on a
// worker. The rules:
//
// - Inline only when quiet. A polling thread runs what it received itself, so a round trip
//   pays no thread hop, when the daemon is quiet (no operation runs anywhere and none went
//   to a worker in the last kBusyNs) and an inline slot is free (one per polling thread).
//   Otherwise the operation goes to a worker: a busy daemon's operations then run side by
//   side and meet in the device scheduler, which can only be fair between requests that
//   wait in it, instead of running one after another, in the order read, on the poller.
// - Never inline what may block for long. A replay sequence (long, and its streamed reads
//   wait for the client to take them) always goes to a worker: the caller hands it off
//   without asking RunHere, so that one client cannot stall every other stream.
// - Standby. When every inline slot has been taken for kStall, a standby thread polls the
//   queue in the polling threads' place until one is free; what it receives finds no slot
//   and goes to a worker. It checks every kStall while operations run inline and sleeps
//   once none has for kIdleNs, until one does.
// - Bounded workers. Workers come from a WorkerPool of at most `workers` threads, and one
//   tenant's operations hold at most `workers_per_tenant` of them. Past either limit (or
//   when the system will not start a thread) HandOff refuses with RESOURCE_EXHAUSTED: no
//   client can make the daemon start threads without bound, and a tenant whose operations
//   hold workers (say sequences streaming to a client that never reads) leaves the other
//   tenants theirs.
//
// Thread safety: thread-safe, except StartStandby, StopStandby and JoinStandby, which one
// thread calls, in that order.
#ifndef REPLAYD_SERVER_DISPATCH_H_
#define REPLAYD_SERVER_DISPATCH_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/worker_pool.h"

namespace replayd {

class Dispatcher {
 public:
  // `inline_slots`: the number of polling threads; `workers` and `workers_per_tenant`: the
  // limits above. Each at least 1.
  Dispatcher(int inline_slots, size_t workers, size_t workers_per_tenant);
  // Stops the standby thread if it runs, then waits for the workers' tasks.
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // True when the calling polling thread may run an operation now: the daemon is quiet and
  // the thread took an inline slot, which it gives back with ReleaseInlineSlot once the
  // operation is over. False: hand the operation off.
  bool RunHere() { return Quiet() && TakeInlineSlot(); }
  void ReleaseInlineSlot();

  // Runs `task`, an operation of `tenant`, on a worker; operations go to workers for
  // kBusyNs after, whether or not it is refused. RESOURCE_EXHAUSTED, and `task` dropped
  // unrun, when `workers` are all busy or `tenant`'s operations hold `workers_per_tenant`.
  // The operation counts against `tenant` until `task` calls the `done` it is given (at
  // most once), or else until it returns: a task calls it before it sends its reply, so
  // that the tenant's next operation, sent on that reply, finds its worker free.
  using Task = std::function<void(const std::function<void()>& done)>;
  absl::Status HandOff(const std::string& tenant, Task task);

  // Counts an operation as running, for the quiet rule, while it lives: every operation,
  // inline or on a worker, runs inside one.
  class RunningOperation {
   public:
    explicit RunningOperation(Dispatcher& dispatcher) : dispatcher_(dispatcher) {
      dispatcher_.running_.fetch_add(1, std::memory_order_acq_rel);
    }
    ~RunningOperation() { dispatcher_.running_.fetch_sub(1, std::memory_order_acq_rel); }
    RunningOperation(const RunningOperation&) = delete;
    RunningOperation& operator=(const RunningOperation&) = delete;

   private:
    Dispatcher& dispatcher_;
  };

  // Starts the standby thread. `poll` waits until `deadline` for one completion of the
  // queue and handles it; it returns false once the queue has been shut down.
  void StartStandby(std::function<bool(absl::Time deadline)> poll);
  // Tells the standby thread to end. A turn polling in the busy threads' place ends first,
  // when one of them is free or the queue is shut down.
  void StopStandby();
  // Waits for the standby thread to end; after StopStandby.
  void JoinStandby();

 private:
  // How long every polling thread may be busy before the standby thread polls.
  static constexpr absl::Duration kStall = absl::Milliseconds(2);
  // With nothing run inline for this long, the standby thread sleeps until something is.
  static constexpr int64_t kIdleNs = 1'000'000'000;
  // After an operation went to a worker, operations keep going to workers for this long.
  static constexpr int64_t kBusyNs = 10'000'000;

  // True when no operation runs and none went to a worker in the last kBusyNs: an
  // operation may run on the polling thread without passing other streams' requests by.
  bool Quiet();
  // Takes an inline slot; false when none is free. Wakes the standby thread if it sleeps.
  bool TakeInlineSlot();
  void ReleaseWorker(const std::string& tenant);
  void Standby(const std::function<bool(absl::Time)>& poll);

  const size_t workers_;
  const size_t workers_per_tenant_;
  std::atomic<int> inline_free_;
  std::atomic<int> running_{0};                 // operations running, on any thread
  std::atomic<int64_t> last_handoff_ns_{0};     // when an operation last went to a worker
  std::atomic<int64_t> last_inline_ns_{0};      // when an operation last started inline
  std::atomic<int64_t> saturated_since_ns_{0};  // when the last inline slot was taken; 0: one is free
  std::atomic<bool> standby_asleep_{false};
  absl::Mutex mu_;  // the standby thread sleeps and waits on it
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread standby_;
  absl::Mutex workers_mu_;
  absl::flat_hash_map<std::string, size_t> tenant_workers_ ABSL_GUARDED_BY(workers_mu_);  // only above 0
  // Declared last, so destroyed first: the workers end before what they use.
  WorkerPool pool_;
};

}  // namespace replayd

#endif  // REPLAYD_SERVER_DISPATCH_H_
