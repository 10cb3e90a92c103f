// The graph cache of one tenant on one device: graph instances by structure, so that a
// repeated capture or definition of the same graph returns the existing instance. The
// structure's hash selects the bucket and a full comparison of the structure confirms
// the hit. Bounded by count and by bytes (arenas and the host memory the instances hold),
// evicting the least recently used.
//
// An evicted instance lives on while graph handles hold it. The instances a session
// created leave the cache when it closes, so a closed session's memory is freed.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_GRAPH_CACHE_H_
#define REPLAYD_ENGINE_GRAPH_CACHE_H_

#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/graph_instance.h"

namespace replayd {

struct GraphCacheOptions {
  size_t max_graphs = 256;
  // Arena bytes and host bytes (GraphInstance::host_bytes) summed over cached instances.
  uint64_t max_bytes = uint64_t{1} << 30;
};

struct GraphCacheStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t instantiations = 0;
  uint64_t evictions = 0;
  uint64_t graphs = 0;  // cached now
  uint64_t bytes = 0;   // arena and host bytes cached now
};

class GraphCache {
 public:
  explicit GraphCache(GraphCacheOptions options) : options_(options) {}

  // The cached instance of `structure`, most recently used now; null on a miss (counted).
  std::shared_ptr<GraphInstance> Lookup(const std::string& structure);
  // Adds a new instance created by `owner`, counted as an instantiation, evicting the
  // least recently used past the limits (never the one just added).
  void Insert(std::shared_ptr<GraphInstance> instance, uint64_t owner);
  // Drops the instances `owner` created.
  void EvictOwner(uint64_t owner);
  // Drops every instance no graph handle holds, to give its memory back to its tenant;
  // returns how many.
  size_t EvictUnheld();
  GraphCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<GraphInstance> instance;
    uint64_t owner;
  };
  using Lru = std::list<Entry>;
  void EvictOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GraphCacheOptions options_;
  mutable absl::Mutex mu_;
  Lru lru_ ABSL_GUARDED_BY(mu_);  // front: most recently used
  absl::flat_hash_map<std::string, Lru::iterator> by_structure_ ABSL_GUARDED_BY(mu_);
  GraphCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_GRAPH_CACHE_H_
