#include "engine/scheduler.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
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
};

Scheduler::Turn::Turn(Turn&& other) noexcept
    : scheduler_(other.scheduler_), queue_(other.queue_), start_ns_(other.start_ns_) {
  other.scheduler_ = nullptr;
}

Scheduler::Turn::~Turn() {
  if (scheduler_) scheduler_->Release(queue_, start_ns_);
}

Scheduler::Scheduler(SchedulerOptions options)
    : fair_({absl::ToInt64Nanoseconds(options.quantum), absl::ToInt64Nanoseconds(options.batch_max_wait)}) {}

Scheduler::~Scheduler() = default;

Scheduler::Queue* Scheduler::QueueFor(TenantAccount* account, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Queue>& q = queues_[account];
  if (!q) {
    q = std::make_unique<Queue>(account);
    fair_.SetShare(q.get(), limits.weight, limits.priority, NowNs());
  }
  return q.get();
}

void Scheduler::SetShare(Queue* queue, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  fair_.SetShare(queue, limits.weight, limits.priority, NowNs());
}

absl::StatusOr<Scheduler::Turn> Scheduler::Acquire(Queue* queue, bool check_quota) {
  absl::MutexLock lock(&mu_);
  if (!busy_ && fair_.waiting() == 0) {
    // Uncontended: still through the policy, so the turn counts in its virtual time.
    FairQueue::Item item;
    const int64_t now = NowNs();
    FairQueue::Queue* from = nullptr;
    fair_.Push(queue, &item, now);
    fair_.Pop(now, &from);
    busy_ = true;
    return Turn(this, queue, now);
  }
  if (check_quota) {
    if (absl::Status s = queue->account->Reserve(Resource::kQueued, 1); !s.ok()) {
      queue->account->CountRejected();
      return absl::ResourceExhaustedError(absl::StrCat(s.message(), " (the device queue is full)"));
    }
  }
  Waiter waiter;
  waiter.counted = check_quota;
  fair_.Push(queue, &waiter, NowNs());
  while (!waiter.granted) waiter.granted_cv.Wait(&mu_);
  return Turn(this, queue, NowNs());
}

void Scheduler::Renew(Turn& turn) {
  Queue* queue = turn.queue_;
  const int64_t now = NowNs();
  const int64_t cost = now - turn.start_ns_;
  queue->account->AddDeviceTime(cost);
  Waiter waiter;
  waiter.counted = false;
  absl::MutexLock lock(&mu_);
  fair_.Charge(queue, cost);
  fair_.Push(queue, &waiter, now);
  busy_ = false;
  Dispatch(now);  // may be this waiter: then the turn goes on with no hand-over
  while (!waiter.granted) waiter.granted_cv.Wait(&mu_);
  turn.start_ns_ = NowNs();
}

void Scheduler::Release(Queue* queue, int64_t start_ns) {
  const int64_t now = NowNs();
  const int64_t cost = now - start_ns;
  queue->account->AddDeviceTime(cost);
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

size_t Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  return fair_.waiting();
}

}  // namespace replayd
