#include "engine/graph_cache.h"

namespace replayd {

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
    stats_.bytes -= it->second->instance->plan().arena_bytes;
    lru_.erase(it->second);
    by_structure_.erase(it);
  }
  stats_.bytes += instance->plan().arena_bytes;
  lru_.push_front({std::move(instance), owner});
  by_structure_.emplace(lru_.front().instance->structure(), lru_.begin());
  while (lru_.size() > 1 && (lru_.size() > options_.max_graphs || stats_.bytes > options_.max_bytes))
    EvictOne();
  stats_.graphs = lru_.size();
}

void GraphCache::EvictOne() {
  Entry& victim = lru_.back();
  stats_.bytes -= victim.instance->plan().arena_bytes;
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
    stats_.bytes -= it->instance->plan().arena_bytes;
    by_structure_.erase(it->instance->structure());
    it = lru_.erase(it);
  }
  stats_.graphs = lru_.size();
}

GraphCacheStats GraphCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace replayd
