#include "engine/scheduler.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace replayd {
namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Waiter : DeficitRoundRobin::Item {
  absl::CondVar granted_cv;
  bool granted = false;
  bool counted = true;  // holds a unit of the tenant's queued quota
};

}  // namespace

class Scheduler::Queue : public DeficitRoundRobin::Queue {
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
    : drr_({absl::ToInt64Nanoseconds(options.quantum), absl::ToInt64Nanoseconds(options.batch_max_wait)}) {}

Scheduler::~Scheduler() = default;

Scheduler::Queue* Scheduler::QueueFor(TenantAccount* account, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Queue>& q = queues_[account];
  if (!q) {
    q = std::make_unique<Queue>(account);
    drr_.SetShare(q.get(), limits.weight, limits.priority, NowNs());
  }
  return q.get();
}

void Scheduler::SetShare(Queue* queue, const TenantLimits& limits) {
  absl::MutexLock lock(&mu_);
  drr_.SetShare(queue, limits.weight, limits.priority, NowNs());
}

absl::StatusOr<Scheduler::Turn> Scheduler::Acquire(Queue* queue, bool check_quota) {
  absl::MutexLock lock(&mu_);
  if (!busy_ && drr_.waiting() == 0) {
    // Uncontended: still through the policy, so the tenant's debt stays bounded.
    DeficitRoundRobin::Item item;
    const int64_t now = NowNs();
    DeficitRoundRobin::Queue* from = nullptr;
    drr_.Push(queue, &item, now);
    drr_.Pop(now, &from);
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
  drr_.Push(queue, &waiter, NowNs());
  while (!waiter.granted) waiter.granted_cv.Wait(&mu_);
  return Turn(this, queue, NowNs());
}

void Scheduler::Release(Queue* queue, int64_t start_ns) {
  const int64_t now = NowNs();
  const int64_t cost = now - start_ns;
  queue->account->AddDeviceTime(cost);
  absl::MutexLock lock(&mu_);
  drr_.Charge(queue, cost);
  busy_ = false;
  Dispatch(now);
}

void Scheduler::Dispatch(int64_t now_ns) {
  DeficitRoundRobin::Queue* from = nullptr;
  auto* waiter = static_cast<Waiter*>(drr_.Pop(now_ns, &from));
  if (!waiter) return;
  if (waiter->counted) static_cast<Queue*>(from)->account->Release(Resource::kQueued, 1);
  busy_ = true;
  waiter->granted = true;
  waiter->granted_cv.Signal();
}

size_t Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  return drr_.waiting();
}

}  // namespace replayd
