#include "engine/scheduler.h"

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace replayd {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// Interactive work this recent makes batch turns lower their thread.
constexpr int64_t kInteractiveRecentNs = 1'000'000'000;

bool SetThreadPolicy(int policy) {
  sched_param param{};
  return pthread_setschedparam(pthread_self(), policy, &param) == 0;
}

// Whether a thread may go to SCHED_IDLE and come back; tried once, on a thread of its own.
bool IdleThreadsPermitted() {
  static const bool permitted = [] {
    bool ok = false;
    int error = 0;
    std::thread probe([&] {
      ok = SetThreadPolicy(SCHED_IDLE);
      if (ok) ok = SetThreadPolicy(SCHED_OTHER);
      if (!ok) error = errno;
    });
    probe.join();
    if (!ok)
      spdlog::warn(
          "batch turns keep their thread priority: a thread may not return from SCHED_IDLE here ({}); "
          "run with CAP_SYS_NICE for interactive latency under batch load",
          std::strerror(error));
    return ok;
  }();
  return permitted;
}

struct Waiter : FairQueue::Item {
  absl::CondVar granted_cv;
  bool granted = false;
  bool counted = true;  // holds a unit of the tenant's queued quota
};

}  // namespace

class Scheduler::Queue : public FairQueue::Queue {
 public:
  explicit Queue(TenantAccount* account) : account(account) {}
  TenantAccount* const account;
  // For queue_stats; written without the scheduler's lock where a turn is charged.
  std::atomic<int64_t> device_ns{0}, wait_ns{0};
  std::atomic<uint64_t> waits{0}, rejected{0};
};

Scheduler::Turn::Turn(Turn&& other) noexcept
    : scheduler_(other.scheduler_), queue_(other.queue_), start_ns_(other.start_ns_), idle_(other.idle_) {
  other.scheduler_ = nullptr;
}

Scheduler::Turn::~Turn() {
  if (scheduler_) scheduler_->Release(*this);
}

Scheduler::Scheduler(SchedulerOptions options)
    : idle_batch_threads_(options.idle_batch_threads && IdleThreadsPermitted()),
      fair_({absl::ToInt64Nanoseconds(options.quantum), absl::ToInt64Nanoseconds(options.batch_max_wait)}) {}

Scheduler::~Scheduler() = default;

Scheduler::Queue* Scheduler::QueueFor(TenantAccount* account, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Queue>& q = queues_[account];
  if (!q) {
    q = std::make_unique<Queue>(account);
    fair_.SetShare(q.get(), limits.weight, limits.priority, SteadyNowNs());
  }
  return q.get();
}

void Scheduler::SetShare(Queue* queue, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  fair_.SetShare(queue, limits.weight, limits.priority, SteadyNowNs());
}

absl::StatusOr<Scheduler::Turn> Scheduler::Acquire(Queue* queue, bool check_quota) {
  bool lower;
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = SteadyNowNs();
    if (queue->priority == Priority::kInteractive) last_interactive_ns_ = now;
    if (!busy_ && fair_.waiting() == 0) {
      // Uncontended: still through the policy, so the turn counts in its virtual time.
      FairQueue::Item item;
      FairQueue::Queue* from = nullptr;
      fair_.Push(queue, &item, now);
      fair_.Pop(now, &from);
      busy_ = true;
    } else {
      if (check_quota) {
        if (absl::Status s = queue->account->Reserve(Resource::kQueued, 1); !s.ok()) {
          queue->account->CountRejected();
          queue->rejected.fetch_add(1, std::memory_order_relaxed);
          return absl::ResourceExhaustedError(absl::StrCat(s.message(), " (the device queue is full)"));
        }
      }
      Waiter waiter;
      waiter.counted = check_quota;
      fair_.Push(queue, &waiter, now);
      while (!waiter.granted) waiter.granted_cv.Wait(&mu_);
      queue->waits.fetch_add(1, std::memory_order_relaxed);
      queue->wait_ns.fetch_add(SteadyNowNs() - now, std::memory_order_relaxed);
    }
    lower = ShouldIdle(queue, now);  // as of the request: recency needs no finer clock
  }
  Turn turn(this, queue, SteadyNowNs(), false);
  Lower(turn, lower);
  return turn;
}

void Scheduler::Renew(Turn& turn) {
  Queue* queue = turn.queue_;
  const int64_t now = SteadyNowNs();
  const int64_t cost = now - turn.start_ns_;
  queue->account->AddDeviceTime(cost);
  queue->device_ns.fetch_add(cost, std::memory_order_relaxed);
  Waiter waiter;
  waiter.counted = false;
  bool lower;
  {
    absl::MutexLock lock(&mu_);
    fair_.Charge(queue, cost);
    fair_.Push(queue, &waiter, now);
    busy_ = false;
    Dispatch(now);  // may be this waiter: then the turn goes on with no hand-over
    while (!waiter.granted) waiter.granted_cv.Wait(&mu_);
    lower = !turn.idle_ && ShouldIdle(queue, now);
  }
  Lower(turn, lower);
  turn.start_ns_ = SteadyNowNs();
}

bool Scheduler::ShouldIdle(const Queue* queue, int64_t now_ns) const {
  return idle_batch_threads_ && queue->priority == Priority::kBatch &&
         now_ns - last_interactive_ns_ < kInteractiveRecentNs;
}

void Scheduler::Lower(Turn& turn, bool lower) {
  if (lower) turn.idle_ = SetThreadPolicy(SCHED_IDLE);
}

void Scheduler::Release(Turn& turn) {
  if (turn.idle_ && !SetThreadPolicy(SCHED_OTHER))
    spdlog::error("a thread could not return from SCHED_IDLE: {}", std::strerror(errno));
  Queue* queue = turn.queue_;
  const int64_t now = SteadyNowNs();
  const int64_t cost = now - turn.start_ns_;
  queue->account->AddDeviceTime(cost);
  queue->device_ns.fetch_add(cost, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  fair_.Charge(queue, cost);
  busy_ = false;
  Dispatch(now);
}

void Scheduler::Dispatch(int64_t now_ns) {
  FairQueue::Queue* from = nullptr;
  auto* waiter = static_cast<Waiter*>(fair_.Pop(now_ns, &from));
  if (!waiter) return;
  if (waiter->counted) static_cast<Queue*>(from)->account->Release(Resource::kQueued, 1);
  busy_ = true;
  waiter->granted = true;
  waiter->granted_cv.Signal();
}

std::vector<Scheduler::QueueStats> Scheduler::queue_stats() const {
  std::vector<QueueStats> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [account, q] : queues_)
    out.push_back({account->name(), absl::Nanoseconds(q->device_ns.load(std::memory_order_relaxed)),
                   q->waits.load(std::memory_order_relaxed),
                   absl::Nanoseconds(q->wait_ns.load(std::memory_order_relaxed)),
                   q->rejected.load(std::memory_order_relaxed)});
  return out;
}

size_t Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  return fair_.waiting();
}

}  // namespace replayd
