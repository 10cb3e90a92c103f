// A tenant's account: the quotas its policy sets and what its sessions use against them,
// summed over all its sessions and devices. Sessions reserve before they take anything;
// a reservation past a quota is RESOURCE_EXHAUSTED naming the quota, with the usage
// unchanged.
//
// Thread safety: thread-safe. Reservations are atomic, so two sessions of one tenant can
// never pass a quota together.
#ifndef REPLAYD_ENGINE_TENANT_H_
#define REPLAYD_ENGINE_TENANT_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "drivers/driver.h"

namespace replayd {

// What a quota limits.
enum class Resource {
  kMemory,    // bytes of device memory: buffers and graph arenas
  kSessions,  // open sessions
  kPrograms,  // loaded programs (program handles)
  kGraphs,    // graph handles
  kQueued,    // work items waiting for a device
  // Bytes of the daemon's own memory held for the tenant: its graph instances (cached or
  // held by handles: the graph, its nodes, its key, the drivers' copies of its nodes) and
  // its open captures' records.
  kHostMemory,
};
inline constexpr size_t kResourceCount = 6;
const char* ResourceName(Resource r);  // "memory_bytes", "sessions", ...

// A limit per resource; 0 is no limit, except for kQueued and kHostMemory, where 0 takes
// the engine's default (a queue, or the daemon's memory, never grows without bound).
using Quotas = std::array<uint64_t, kResourceCount>;

// Priority classes: interactive work goes before batch work, with starvation prevention.
enum class Priority { kInteractive, kBatch };

struct TenantLimits {
  Quotas quotas = {};
  uint32_t weight = 1;  // share of device time while tenants compete, 1 to kMaxWeight
  Priority priority = Priority::kBatch;
  // Where its device work runs, and the longest one command may run there (zero: the
  // device's default); see ContextOptions.
  Isolation isolation = Isolation::kProcess;
  absl::Duration max_launch = absl::ZeroDuration();
};
inline constexpr uint32_t kMaxWeight = 1000;

struct TenantUsage {
  std::array<uint64_t, kResourceCount> used = {};
  absl::Duration device_time;  // all work the scheduler granted, measured
  uint64_t work_items = 0;     // granted
  uint64_t rejected = 0;       // work items refused because the queue was full
};

class TenantAccount {
 public:
  TenantAccount(std::string name, const Quotas& quotas) : name_(std::move(name)) { set_quotas(quotas); }
  TenantAccount(const TenantAccount&) = delete;
  TenantAccount& operator=(const TenantAccount&) = delete;

  const std::string& name() const { return name_; }

  // Adds `amount` to the usage of `r`, or RESOURCE_EXHAUSTED ("tenant research:
  // memory_bytes quota of 1048576 exceeded: 1040000 in use, 16384 requested") and no change.
  absl::Status Reserve(Resource r, uint64_t amount);
  // Returns what a Reserve took.
  void Release(Resource r, uint64_t amount);

  void set_quotas(const Quotas& quotas);
  Quotas quotas() const;
  TenantUsage usage() const;

  // Scheduler bookkeeping.
  void AddDeviceTime(int64_t nanos);
  void CountRejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }

 private:
  const std::string name_;
  std::array<std::atomic<uint64_t>, kResourceCount> quota_ = {};
  std::array<std::atomic<uint64_t>, kResourceCount> used_ = {};
  std::atomic<int64_t> device_nanos_ = 0;
  std::atomic<uint64_t> work_items_ = 0;
  std::atomic<uint64_t> rejected_ = 0;
};

// Releases a reservation on destruction unless committed: for operations that reserve
// first and may fail after.
class Reservation {
 public:
  Reservation(TenantAccount* account, Resource r, uint64_t amount)
      : account_(account), resource_(r), amount_(amount) {}
  ~Reservation() {
    if (account_) account_->Release(resource_, amount_);
  }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  void Commit() { account_ = nullptr; }

 private:
  TenantAccount* account_;
  Resource resource_;
  uint64_t amount_;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_TENANT_H_
