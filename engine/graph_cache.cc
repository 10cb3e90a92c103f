#include "engine/graph_cache.h"

namespace replayd {
namespace {

// What an instance counts for against the cache's byte bound: its arena and the host
// memory it holds.
uint64_t CachedBytes(const GraphInstance& instance) { return instance.plan().arena_bytes + instance.host_bytes(); }

}  // namespace

std::shared_ptr<GraphInstance> GraphCache::Lookup(const std::string& structure) {
  absl::MutexLock lock(&mu_);
  auto it = by_structure_.find(structure);
  if (it == by_structure_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->instance;
}

void GraphCache::Insert(std::shared_ptr<GraphInstance> instance, uint64_t owner) {
  absl::MutexLock lock(&mu_);
  ++stats_.instantiations;
  const std::string& structure = instance->structure();
  if (auto it = by_structure_.find(structure); it != by_structure_.end()) {
    // Two sessions built the same graph at once: keep the newer.
    stats_.bytes -= CachedBytes(*it->second->instance);
    lru_.erase(it->second);
    by_structure_.erase(it);
  }
  stats_.bytes += CachedBytes(*instance);
  lru_.push_front({std::move(instance), owner});
  by_structure_.emplace(lru_.front().instance->structure(), lru_.begin());
  while (lru_.size() > 1 && (lru_.size() > options_.max_graphs || stats_.bytes > options_.max_bytes))
    EvictOne();
  stats_.graphs = lru_.size();
}

void GraphCache::EvictOne() {
  Entry& victim = lru_.back();
  stats_.bytes -= CachedBytes(*victim.instance);
  by_structure_.erase(victim.instance->structure());
  lru_.pop_back();
  ++stats_.evictions;
}

void GraphCache::EvictOwner(uint64_t owner) {
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->owner != owner) {
      ++it;
      continue;
    }
    stats_.bytes -= CachedBytes(*it->instance);
    by_structure_.erase(it->instance->structure());
    it = lru_.erase(it);
  }
  stats_.graphs = lru_.size();
}

size_t GraphCache::EvictUnheld() {
  absl::MutexLock lock(&mu_);
  size_t evicted = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    // Held only here: the lock keeps Lookup from taking another reference meanwhile.
    if (it->instance.use_count() != 1) {
      ++it;
      continue;
    }
    stats_.bytes -= CachedBytes(*it->instance);
    by_structure_.erase(it->instance->structure());
    it = lru_.erase(it);
    ++stats_.evictions;
    ++evicted;
  }
  stats_.graphs = lru_.size();
  return evicted;
}

GraphCacheStats GraphCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace replayd
