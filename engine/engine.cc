#include "engine/engine.h"

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace replayd {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    EngineOptions options, std::vector<std::unique_ptr<Device>> devices) {
  if (options.lease <= absl::ZeroDuration())
    return absl::InvalidArgumentError("lease must be positive");
  absl::StatusOr<std::unique_ptr<CompileCache>> cache = CompileCache::Open(options.cache_dir);
  if (!cache.ok()) return cache.status();
  return std::unique_ptr<Engine>(
      new Engine(std::move(options), std::move(devices), std::move(*cache)));
}

Engine::Engine(EngineOptions options, std::vector<std::unique_ptr<Device>> devices,
               std::unique_ptr<CompileCache> cache)
    : options_(std::move(options)),
      devices_(std::move(devices)),
      compile_cache_(std::move(cache)),
      reaper_([this] { ReaperMain(); }) {}

Engine::~Engine() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_.join();
  absl::flat_hash_map<SessionId, std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, session] : sessions) session->Close();
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

absl::StatusOr<std::shared_ptr<Session>> Engine::OpenSession(absl::string_view tenant,
                                                             absl::string_view device) {
  Device* found = nullptr;
  for (const auto& d : devices_)
    if (d->info().id == device) found = d.get();
  if (!found) return absl::NotFoundError(absl::StrCat("device \"", device.substr(0, 64), "\" not found"));
  absl::StatusOr<std::unique_ptr<Context>> context = found->OpenContext();
  if (!context.ok()) return context.status();
  absl::MutexLock lock(&mu_);
  SessionId id;
  do {
    id = absl::Uniform<uint64_t>(random_);
  } while (id == 0 || sessions_.contains(id));
  SessionEnv env{found, compile_cache_.get(), GraphCacheFor(tenant, found), options_.batch};
  auto session = std::make_shared<Session>(id, std::string(tenant), env,
                                           std::shared_ptr<Context>(std::move(*context)),
                                           options_.lease);
  sessions_.emplace(id, session);
  spdlog::debug("session {:016x} opened by {} on {}", id, std::string(tenant), std::string(device));
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> Engine::FindSession(absl::string_view tenant,
                                                             SessionId id) {
  absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->tenant() != tenant || it->second->Expired(now))
    return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
  it->second->Renew(now);
  return it->second;
}

absl::Status Engine::CloseSession(absl::string_view tenant, SessionId id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end() || it->second->tenant() != tenant)
      return absl::NotFoundError(absl::StrCat("session ", id, " not found"));
    session = std::move(it->second);
    sessions_.erase(it);
  }
  session->Close();
  spdlog::debug("session {:016x} closed", id);
  return absl::OkStatus();
}

int Engine::ReapExpired(absl::Time now) {
  std::vector<std::shared_ptr<Session>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second->Expired(now)) {
        expired.push_back(std::move(it->second));
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : expired) {
    spdlog::info("session {:016x} of {} expired; freeing {} bytes", s->id(), s->tenant(),
                 s->memory_in_use());
    s->Close();
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

size_t Engine::session_count() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
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
