#include "engine/tenant.h"

#include "absl/strings/str_cat.h"

namespace replayd {

const char* ResourceName(Resource r) {
  switch (r) {
    case Resource::kMemory: return "memory_bytes";
    case Resource::kSessions: return "sessions";
    case Resource::kPrograms: return "programs";
    case Resource::kGraphs: return "graphs";
    case Resource::kHostMemory: return "host_bytes";
    case Resource::kQueued: return "queued";
  }
  return "?";
}

absl::Status TenantAccount::Reserve(Resource r, uint64_t amount) {
  const size_t i = static_cast<size_t>(r);
  const uint64_t quota = quota_[i].load(std::memory_order_relaxed);
  uint64_t used = used_[i].load(std::memory_order_relaxed);
  for (;;) {
    uint64_t after;
    if (__builtin_add_overflow(used, amount, &after) || (quota != 0 && after > quota)) {
      return absl::ResourceExhaustedError(absl::StrCat("tenant ", name_, ": ", ResourceName(r),
                                                       " quota of ", quota, " exceeded: ", used,
                                                       " in use, ", amount, " requested"));
    }
    if (used_[i].compare_exchange_weak(used, after, std::memory_order_relaxed)) return absl::OkStatus();
  }
}

void TenantAccount::Release(Resource r, uint64_t amount) {
  used_[static_cast<size_t>(r)].fetch_sub(amount, std::memory_order_relaxed);
}

void TenantAccount::set_quotas(const Quotas& quotas) {
  for (size_t i = 0; i < kResourceCount; ++i) quota_[i].store(quotas[i], std::memory_order_relaxed);
}

Quotas TenantAccount::quotas() const {
  Quotas q;
  for (size_t i = 0; i < kResourceCount; ++i) q[i] = quota_[i].load(std::memory_order_relaxed);
  return q;
}

TenantUsage TenantAccount::usage() const {
  TenantUsage u;
  for (size_t i = 0; i < kResourceCount; ++i) u.used[i] = used_[i].load(std::memory_order_relaxed);
  u.device_time = absl::Nanoseconds(device_nanos_.load(std::memory_order_relaxed));
  u.work_items = work_items_.load(std::memory_order_relaxed);
  u.rejected = rejected_.load(std::memory_order_relaxed);
  return u;
}

void TenantAccount::AddDeviceTime(int64_t nanos) {
  device_nanos_.fetch_add(nanos, std::memory_order_relaxed);
  work_items_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace replayd
