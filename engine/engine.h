// The engine: the devices, the compile cache and the sessions of every tenant. The
// server calls it for session lifetime and then calls the session's operations.
//
// Sessions whose lease passes without renewal are closed by a reaper thread the engine
// owns, and everything they own is freed.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_ENGINE_H_
#define REPLAYD_ENGINE_ENGINE_H_

#include <filesystem>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/driver.h"
#include "engine/compile_cache.h"
#include "engine/graph_cache.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "engine/tenant.h"

namespace replayd {

struct EngineOptions {
  absl::Duration lease = absl::Seconds(60);
  std::filesystem::path cache_dir;
  CompileCacheOptions compile_cache;
  GraphCacheOptions graph_cache;  // per tenant and device
  BatchOptions batch;
  SchedulerOptions scheduler;     // per device
  uint64_t queue_limit = 1024;    // a tenant's waiting work items when its quota sets none
  // The daemon's memory a tenant's graph instances may hold when its quota sets none.
  uint64_t host_bytes = uint64_t{1} << 30;
};

// The limits of one tenant, from the tenants file.
struct TenantConfig {
  std::string name;
  TenantLimits limits;
};

struct SessionReport {
  SessionId id = 0;
  std::string device;
  uint64_t memory_bytes = 0;  // its buffers
  size_t programs = 0;
  size_t graphs = 0;
  absl::Time deadline;        // of its lease
};

struct TenantReport {
  std::string name;
  TenantLimits limits;  // with the quotas in force (the default queue limit filled in)
  TenantUsage usage;
  std::vector<SessionReport> sessions;
};

struct DeviceStatus {
  const DeviceInfo* info;
  uint64_t free_memory;
};

// For the daemon's metrics: a device's scheduler, and a tenant's graph cache on a device.
struct SchedulerReport {
  std::string device;
  size_t waiting = 0;  // work items waiting now
  std::vector<Scheduler::QueueStats> queues;
};
struct GraphCacheReport {
  std::string tenant;
  std::string device;
  GraphCacheStats stats;
};

class Engine {
 public:
  // An engine over `devices`. INTERNAL when the compile cache cannot be opened.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      EngineOptions options, std::vector<std::unique_ptr<Device>> devices);
  // Closes every session and stops the reaper.
  ~Engine();

  std::vector<DeviceStatus> ListDevices() const;

  // A new session of `tenant` on the device with id `device` ("cpu:0"); NOT_FOUND for
  // a device this daemon does not own.
  absl::StatusOr<std::shared_ptr<DeviceSession>> OpenSession(absl::string_view tenant,
                                                       absl::string_view device);
  // The open session `id` of `tenant`, with its lease renewed. NOT_FOUND for an unknown,
  // closed, expired or other tenant's session: existence is not disclosed.
  // FAILED_PRECONDITION with the cause for one closed because its context was lost.
  absl::StatusOr<std::shared_ptr<DeviceSession>> FindSession(absl::string_view tenant, SessionId id);
  absl::Status CloseSession(absl::string_view tenant, SessionId id);
  // The id of the device `tenant`'s open session `id` runs on, "" for none; for labels,
  // so unlike FindSession it leaves the lease alone.
  std::string DeviceOfSession(absl::string_view tenant, SessionId id) const;

  // Sets the limits of the tenants listed (a tenant seen for the first time gets an
  // account). Tenants not listed keep their accounts and limits: a revoked tenant's
  // sessions live on until they close. Takes effect for open sessions at once.
  void ConfigureTenants(const std::vector<TenantConfig>& tenants);
  // Every tenant with an account, by name, with its usage and open sessions.
  std::vector<TenantReport> Tenants() const;
  // Closes session `id` whichever tenant owns it (the admin's close) and returns that
  // tenant; NOT_FOUND if no such session is open.
  absl::StatusOr<std::string> AdminCloseSession(SessionId id);

  // Closes the sessions whose lease has passed at `now` (one running an operation once it
  // has ended, at a later call); returns how many expired. Closes as well the sessions
  // whose context was lost (their executor ended), so that their memory and counts go
  // back to their tenant.
  int ReapExpired(absl::Time now);
  size_t session_count() const;
  // The graph cache counters of `tenant` on `device`; zero when it has none.
  GraphCacheStats graph_cache_stats(absl::string_view tenant, absl::string_view device) const;
  absl::Duration lease() const { return options_.lease; }

  // Counters for the daemon's metrics: per device, per tenant and device, and the compile
  // cache's.
  std::vector<SchedulerReport> scheduler_reports() const;
  std::vector<GraphCacheReport> graph_cache_reports() const;
  CompileCacheStats compile_cache_stats() const { return compile_cache_->stats(); }

 private:
  Engine(EngineOptions options, std::vector<std::unique_ptr<Device>> devices,
         std::unique_ptr<CompileCache> cache);
  void ReaperMain();
  // Closes `session` now unless an operation of it runs; then it is kept in closing_ and
  // closed by a later reaper pass, once that operation has ended. `why` is for the log.
  void CloseOrDefer(std::shared_ptr<DeviceSession> session, absl::string_view why);
  // Records that session `id` of `tenant` was closed because its context was lost.
  void Remember(SessionId id, const std::string& tenant, absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes what closing_ holds that no longer runs an operation; returns how many.
  int CloseDeferred();
  GraphCache* GraphCacheFor(absl::string_view tenant, const Device* device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct TenantState {
    std::unique_ptr<TenantAccount> account;
    TenantLimits limits;
  };
  TenantState& TenantFor(absl::string_view tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `limits` with the engine's defaults where the quota sets none.
  TenantLimits InForce(TenantLimits limits) const;

  const EngineOptions options_;
  const std::vector<std::unique_ptr<Device>> devices_;
  const std::unique_ptr<CompileCache> compile_cache_;

  mutable absl::Mutex mu_;
  // Never shrinks: sessions and scheduler queues point at its accounts, so it is
  // declared before (and destroyed after) everything that holds them.
  absl::flat_hash_map<std::string, TenantState> tenants_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Scheduler>> schedulers_;  // one per device, in its order
  absl::flat_hash_map<SessionId, std::shared_ptr<DeviceSession>> sessions_ ABSL_GUARDED_BY(mu_);
  // Sessions closed or expired while an operation of theirs ran: out of sessions_ (so
  // NOT_FOUND to clients), freed by the reaper once the operation ends.
  std::vector<std::shared_ptr<DeviceSession>> closing_ ABSL_GUARDED_BY(mu_);
  // Sessions the engine closed because their context was lost (their executor ended),
  // with the cause, which FindSession answers for them until their owner closes them.
  // The oldest are forgotten past kMaxLost.
  struct Lost {
    std::string tenant;
    absl::Status cause;
  };
  static constexpr size_t kMaxLost = 4096;
  absl::flat_hash_map<SessionId, Lost> lost_ ABSL_GUARDED_BY(mu_);
  std::deque<SessionId> lost_order_ ABSL_GUARDED_BY(mu_);
  absl::BitGen random_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, const Device*>, std::unique_ptr<GraphCache>>
      graph_caches_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reaper_;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_ENGINE_H_
