// The device scheduler: work on one device (launches, replays, copies) takes a turn
// before it runs, one turn at a time. Turns go to per-tenant queues by weighted fair
// queueing on measured device time (the time a turn is held), interactive before batch
// (see FairQueue). A session runs its operations one at a time, so its
// order is kept; a tenant's queue is FIFO.
//
// A tenant whose waiting work items reach its `queued` quota is answered
// RESOURCE_EXHAUSTED at once, so no caller blocks without bound behind a full queue.
//
// An uncontended turn is a lock, a queue push and pop and a clock read; nothing is
// allocated.
//
// With `idle_batch_threads`, a batch turn taken while interactive work has come in the
// last second runs its thread at SCHED_IDLE until the turn is released (kept across
// Renew: a switch costs a few microseconds). For a CPU device the device is the daemon's
// own cores, and the thread that holds a batch turn would otherwise delay an interactive
// request's thread by the kernel's time slice before it even reaches the queue. Needs
// the right to return a thread to SCHED_OTHER (root or CAP_SYS_NICE, or an RLIMIT_NICE
// of 20): checked once, and without it the option is off and says so once in the log.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_SCHEDULER_H_
#define REPLAYD_ENGINE_SCHEDULER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/fair_queue.h"
#include "engine/tenant.h"

namespace replayd {

// Now on the steady clock, in nanoseconds: the time base of the scheduler's charges.
int64_t SteadyNowNs();

struct SchedulerOptions {
  absl::Duration quantum = absl::Microseconds(500);  // banked while idle, times the weight
  absl::Duration batch_max_wait = absl::Milliseconds(20);
  bool idle_batch_threads = false;  // see above; for CPU devices
};

class Scheduler {
 public:
  // One tenant's queue on this device.
  class Queue;

  // The right to use the device, released (and its time charged) on destruction.
  class Turn {
   public:
    Turn(Turn&& other) noexcept;
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    friend class Scheduler;
    Turn(Scheduler* scheduler, Queue* queue, int64_t start_ns, bool idle)
        : scheduler_(scheduler), queue_(queue), start_ns_(start_ns), idle_(idle) {}
    Scheduler* scheduler_;
    Queue* queue_;
    int64_t start_ns_;
    bool idle_;  // its thread runs at SCHED_IDLE
  };

  explicit Scheduler(SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // The queue of `account`'s tenant, made on first use with `limits`' share; it lives as
  // long as the scheduler, and `account` must too.
  Queue* QueueFor(TenantAccount* account, const TenantLimits& limits);
  // Sets a queue's weight and priority class (a tenants file reload).
  void SetShare(Queue* queue, const TenantLimits& limits);

  // Waits for the device. RESOURCE_EXHAUSTED when the queue's tenant already has its
  // `queued` quota of work items waiting, unless `check_quota` is false (the later steps
  // of work admitted once, such as the replays of a sequence).
  absl::StatusOr<Turn> Acquire(Queue* queue, bool check_quota = true);

  // Gives `turn` back and waits for the next turn of the same queue, as the next step of
  // work admitted once (no quota check). Its queue is never empty in between, so a
  // tenant running long work keeps its share even when it has a single session.
  void Renew(Turn& turn);

  // Work items waiting now, over all tenants.
  size_t waiting() const;

  // What one tenant's queue has had of the device, counted since it was made.
  struct QueueStats {
    std::string tenant;
    absl::Duration device_time;  // turns held
    uint64_t waits = 0;          // Acquires that waited for another tenant's turn
    absl::Duration wait_time;    // their waits, summed
    uint64_t rejected = 0;       // Acquires refused because the tenant's queue was full
  };
  std::vector<QueueStats> queue_stats() const;

  // Whether batch turns lower their thread (the option, where permitted).
  bool idle_batch_threads() const { return idle_batch_threads_; }

 private:
  void Release(Turn& turn);
  // Whether a turn of `queue` granted now should run its thread at SCHED_IDLE.
  bool ShouldIdle(const Queue* queue, int64_t now_ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lowers the calling thread for `turn`, if `lower`.
  static void Lower(Turn& turn, bool lower);
  // Grants the next turn, if any waits. Requires the device to be free.
  void Dispatch(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool idle_batch_threads_;
  mutable absl::Mutex mu_;
  int64_t last_interactive_ns_ ABSL_GUARDED_BY(mu_) = INT64_MIN / 2;  // an interactive Acquire
  FairQueue fair_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<const TenantAccount*, std::unique_ptr<Queue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_SCHEDULER_H_
