#include "engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/accounted_context.h"
#include "spdlog/spdlog.h"

namespace replayd {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    EngineOptions options, std::vector<std::unique_ptr<Device>> devices) {
  if (options.lease <= absl::ZeroDuration())
    return absl::InvalidArgumentError("lease must be positive");
  absl::StatusOr<std::unique_ptr<CompileCache>> cache = CompileCache::Open(options.cache_dir, options.compile_cache);
  if (!cache.ok()) return cache.status();
  return std::unique_ptr<Engine>(
      new Engine(std::move(options), std::move(devices), std::move(*cache)));
}

Engine::Engine(EngineOptions options, std::vector<std::unique_ptr<Device>> devices,
               std::unique_ptr<CompileCache> cache)
    : options_(std::move(options)),
      devices_(std::move(devices)),
      compile_cache_(std::move(cache)) {
  for (const auto& device : devices_) {
    SchedulerOptions scheduler = options_.scheduler;
    // On other devices the work runs off the CPU and the thread only waits for it.
    scheduler.idle_batch_threads &= device->info().kind == DeviceKind::kCpu;
    schedulers_.push_back(std::make_unique<Scheduler>(scheduler));
  }
  reaper_ = std::thread([this] { ReaperMain(); });
}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_.join();
  absl::flat_hash_map<SessionId, std::shared_ptr<DeviceSession>> sessions;
  std::vector<std::shared_ptr<DeviceSession>> closing;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(sessions_);
    closing.swap(closing_);
  }
  for (auto& [id, session] : sessions) session->Close();
  for (auto& session : closing) session->Close();
}


std::vector<DeviceStatus> Engine::ListDevices() const {
  std::vector<DeviceStatus> out;
  for (const auto& d : devices_) {
    uint64_t used = d->memory_in_use();
    uint64_t total = d->info().total_memory;
    out.push_back({&d->info(), used < total ? total - used : 0});
  }
  return out;
}

absl::StatusOr<std::shared_ptr<DeviceSession>> Engine::OpenSession(absl::string_view tenant,
                                                             absl::string_view device) {
  size_t index = devices_.size();
  for (size_t i = 0; i < devices_.size(); ++i)
    if (devices_[i]->info().id == device) index = i;
  if (index == devices_.size())
    return absl::NotFoundError(absl::StrCat("device \"", device.substr(0, 64), "\" not found"));
  Device* found = devices_[index].get();
  TenantAccount* account;
  TenantLimits limits;
  {
    absl::MutexLock lock(&mu_);
    TenantState& t = TenantFor(tenant);
    account = t.account.get();
    limits = t.limits;
  }
  if (absl::Status s = account->Reserve(Resource::kSessions, 1); !s.ok()) return s;
  Reservation reserved(account, Resource::kSessions, 1);
  absl::StatusOr<std::unique_ptr<Context>> context = found->OpenContext(
      {std::string(tenant), limits.isolation, limits.max_launch, limits.quotas[static_cast<size_t>(Resource::kMemory)]});
  if (!context.ok()) return context.status();
  auto accounted = std::make_shared<AccountedContext>(std::move(*context), account);
  Scheduler* scheduler = schedulers_[index].get();
  Scheduler::Queue* queue = scheduler->QueueFor(account, limits);
  absl::MutexLock lock(&mu_);
  SessionId id;
  do {
    id = absl::Uniform<uint64_t>(random_);
  } while (id == 0 || sessions_.contains(id));
  SessionEnv env{found, compile_cache_.get(), GraphCacheFor(tenant, found), options_.batch,
                 account, scheduler, queue};
  auto session = std::make_shared<DeviceSession>(id, std::string(tenant), env, std::move(accounted),
                                           options_.lease);
  sessions_.emplace(id, session);
  reserved.Commit();  // Close gives it back
  spdlog::debug("session {:016x} opened by {} on {}", id, std::string(tenant), std::string(device));
  return session;
}

TenantLimits Engine::InForce(TenantLimits limits) const {
  uint64_t& queued = limits.quotas[static_cast<size_t>(Resource::kQueued)];
  if (queued == 0) queued = options_.queue_limit;
  uint64_t& host = limits.quotas[static_cast<size_t>(Resource::kHostMemory)];
  if (host == 0) host = options_.host_bytes;
  limits.weight = std::clamp<uint32_t>(limits.weight, 1, kMaxWeight);
  return limits;
}

Engine::TenantState& Engine::TenantFor(absl::string_view tenant) {
  TenantState& t = tenants_[tenant];
  if (!t.account) {
    t.limits = InForce({});
    t.account = std::make_unique<TenantAccount>(std::string(tenant), t.limits.quotas);
  }
  return t;
}

void Engine::ConfigureTenants(const std::vector<TenantConfig>& tenants) {
  absl::MutexLock lock(&mu_);
  for (const TenantConfig& c : tenants) {
    TenantState& t = TenantFor(c.name);
    t.limits = InForce(c.limits);
    t.account->set_quotas(t.limits.quotas);
    for (auto& scheduler : schedulers_) scheduler->SetShare(scheduler->QueueFor(t.account.get(), t.limits), t.limits);
  }
}

std::vector<TenantReport> Engine::Tenants() const {
  std::vector<TenantReport> out;
  std::vector<std::shared_ptr<DeviceSession>> sessions;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, t] : tenants_) out.push_back({name, t.limits, t.account->usage(), {}});
    for (const auto& [id, s] : sessions_) sessions.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const TenantReport& a, const TenantReport& b) { return a.name < b.name; });
  for (const auto& s : sessions) {
    auto it = std::lower_bound(out.begin(), out.end(), s->tenant(),
                               [](const TenantReport& r, const std::string& name) { return r.name < name; });
    if (it == out.end() || it->name != s->tenant()) continue;
    it->sessions.push_back({s->id(), s->device().id, s->memory_in_use(), s->program_count(),
                            s->graph_count(), s->deadline()});
  }
  for (TenantReport& r : out)
    std::sort(r.sessions.begin(), r.sessions.end(),
              [](const SessionReport& a, const SessionReport& b) { return a.id < b.id; });
  return out;
}

absl::StatusOr<std::shared_ptr<DeviceSession>> Engine::FindSession(absl::string_view tenant,
                                                             SessionId id) {
  absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->tenant() != tenant || it->second->Expired(now)) {
    auto lost = lost_.find(id);
    if (it == sessions_.end() && lost != lost_.end() && lost->second.tenant == tenant) return lost->second.cause;
    return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
  }
  it->second->Renew(now);
  return it->second;
}

std::string Engine::DeviceOfSession(absl::string_view tenant, SessionId id) const {
  absl::MutexLock lock(&mu_);
  const auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->tenant() != tenant) return "";
  return it->second->device().id;
}

absl::Status Engine::CloseSession(absl::string_view tenant, SessionId id) {
  std::shared_ptr<DeviceSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->tenant() != tenant) {
      // Closing a session the engine closed for its lost context acknowledges it.
      auto lost = lost_.find(id);
      if (it == sessions_.end() && lost != lost_.end() && lost->second.tenant == tenant) {
        lost_.erase(lost);
        return absl::OkStatus();
      }
      return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
    }
    session = std::move(it->second);
    sessions_.erase(it);
  }
  CloseOrDefer(std::move(session), "closed");
  return absl::OkStatus();
}

void Engine::CloseOrDefer(std::shared_ptr<DeviceSession> session, absl::string_view why) {
  if (session->TryClose()) {
    spdlog::debug("session {:016x} {}", session->id(), std::string(why));
    return;
  }
  spdlog::info("session {:016x} of {} {} while an operation runs: freed when it ends", session->id(),
               session->tenant(), std::string(why));
  absl::MutexLock lock(&mu_);
  closing_.push_back(std::move(session));
}

int Engine::CloseDeferred() {
  std::vector<std::shared_ptr<DeviceSession>> closing;
  {
    absl::MutexLock lock(&mu_);
    closing.swap(closing_);
  }
  int closed = 0;
  std::vector<std::shared_ptr<DeviceSession>> still;
  for (auto& s : closing) {
    if (s->TryClose()) {
      ++closed;
    } else {
      still.push_back(std::move(s));
    }
  }
  absl::MutexLock lock(&mu_);
  closing_.insert(closing_.end(), std::make_move_iterator(still.begin()), std::make_move_iterator(still.end()));
  return closed;
}

absl::StatusOr<std::string> Engine::AdminCloseSession(SessionId id) {
  std::shared_ptr<DeviceSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
    session = std::move(it->second);
    sessions_.erase(it);
  }
  spdlog::info("session {:016x} of {} closed by an admin", id, session->tenant());
  std::string tenant = session->tenant();
  CloseOrDefer(std::move(session), "closed by an admin");
  return tenant;
}

int Engine::ReapExpired(absl::Time now) {
  std::vector<std::shared_ptr<DeviceSession>> expired, lost;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second->Expired(now)) {
        expired.push_back(std::move(it->second));
        sessions_.erase(it++);
      } else if (absl::Status health = it->second->health(); !health.ok()) {
        Remember(it->first, it->second->tenant(), std::move(health));
        lost.push_back(std::move(it->second));
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : lost) {
    spdlog::warn("session {:016x} of {} lost its context ({}); freeing {} bytes", s->id(), s->tenant(),
                 std::string(s->health().message()), s->memory_in_use());
    CloseOrDefer(std::move(s), "lost");
  }
  // A session whose operation still runs (a kernel that does not return) is closed at a
  // later pass, once it ends: the reaper never waits on one session's work, so the others
  // are still freed.
  CloseDeferred();
  for (auto& s : expired) {
    spdlog::info("session {:016x} of {} expired; freeing {} bytes", s->id(), s->tenant(), s->memory_in_use());
    CloseOrDefer(std::move(s), "expired");
  }
  return static_cast<int>(expired.size());
}

GraphCache* Engine::GraphCacheFor(absl::string_view tenant, const Device* device) {
  auto& cache = graph_caches_[std::make_pair(std::string(tenant), device)];
  if (!cache) cache = std::make_unique<GraphCache>(options_.graph_cache);
  return cache.get();
}

GraphCacheStats Engine::graph_cache_stats(absl::string_view tenant, absl::string_view device) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, cache] : graph_caches_)
    if (key.first == tenant && key.second->info().id == device) return cache->stats();
  return {};
}

std::vector<SchedulerReport> Engine::scheduler_reports() const {
  std::vector<SchedulerReport> out;
  for (size_t i = 0; i < devices_.size(); ++i)
    out.push_back({devices_[i]->info().id, schedulers_[i]->waiting(), schedulers_[i]->queue_stats()});
  return out;
}

std::vector<GraphCacheReport> Engine::graph_cache_reports() const {
  std::vector<GraphCacheReport> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, cache] : graph_caches_) out.push_back({key.first, key.second->info().id, cache->stats()});
  return out;
}

size_t Engine::session_count() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void Engine::Remember(SessionId id, const std::string& tenant, absl::Status cause) {
  lost_[id] = Lost{tenant, std::move(cause)};
  lost_order_.push_back(id);
  while (lost_order_.size() > kMaxLost) {
    lost_.erase(lost_order_.front());
    lost_order_.pop_front();
  }
}

void Engine::ReaperMain() {
  absl::Duration period = std::min(options_.lease / 4, absl::Seconds(1));
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
      if (stopping_) return;
    }
    ReapExpired(absl::Now());
  }
}

}  // namespace replayd
