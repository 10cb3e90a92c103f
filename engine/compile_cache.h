// The program compile cache: artifacts content-addressed by the SHA-256 of everything
// they are made from (format, device target, code, entry, signature, options), stored
// on disk so a restarted daemon loads them without compiling.
//
// Artifacts are written to a temporary file and renamed into place, so a crash mid-write
// never leaves a partial artifact under a key, and concurrent compiles of one key (in
// this process they are coalesced; across processes the last rename wins, and both
// artifacts are equivalent) are safe.
//
// Thread safety: thread-safe.
#ifndef REPLAYD_ENGINE_COMPILE_CACHE_H_
#define REPLAYD_ENGINE_COMPILE_CACHE_H_

#include <filesystem>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "drivers/driver.h"

namespace replayd {

// The content key of `source` compiled for `target`: 64 lowercase hex digits.
std::string CompileKey(const ProgramSource& source, absl::string_view target);

struct CompiledArtifact {
  std::string key;
  std::filesystem::path path;
  bool cache_hit = false;
  absl::Duration compile_time;  // zero on a hit
};

class CompileCache {
 public:
  // Creates `dir` (mode 0700) if needed. Temporary files older than an hour, left by a
  // crashed compile, are removed.
  static absl::StatusOr<std::unique_ptr<CompileCache>> Open(const std::filesystem::path& dir);

  // The artifact for `source` on `device`, compiling it on a miss. Compile errors are
  // returned as the device reports them; nothing is cached for them.
  absl::StatusOr<CompiledArtifact> GetOrCompile(Device& device, const ProgramSource& source);

  // Removes the artifact under `key` (one that failed to load), so the next
  // GetOrCompile compiles it again.
  void Invalidate(const std::string& key);

  const std::filesystem::path& dir() const { return dir_; }

 private:
  explicit CompileCache(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::shared_ptr<absl::Mutex> KeyLock(const std::string& key);

  const std::filesystem::path dir_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<absl::Mutex>> key_locks_ ABSL_GUARDED_BY(mu_);
  uint64_t temp_counter_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_COMPILE_CACHE_H_
