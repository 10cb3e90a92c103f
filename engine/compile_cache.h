// The program compile cache: artifacts content-addressed by the SHA-256 of everything
// they are made from (format, device target, code, entry, signature, options), stored
// on disk so a restarted daemon loads them without compiling.
//
// Artifacts are written to a temporary file and renamed into place, so a crash mid-write
// never leaves a partial artifact under a key, and concurrent compiles of one key (in
// this process they are coalesced; across processes the last rename wins, and both
// artifacts are equivalent) are safe.
//
// With a scratch directory, compiles are written there and then stored in the cache (a
// rename, or a copy and a rename across file systems). A cache directory that cannot
// take an artifact (read-only, full) does not fail the compile: the artifact stays in the
// scratch directory for this process's life, the cache says so in one log line (and in
// one more when it stores again), and a restarted daemon compiles the program again.
//
// The cache is bounded: past `max_bytes` of artifacts the least recently used are
// removed (their programs stay loaded; a later load compiles them again), except those
// used within `keep_recent`, so that a load right after its compile finds its file.
// Use survives restarts through each artifact's modification time.
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

struct CompileCacheOptions {
  uint64_t max_bytes = uint64_t{1} << 30;           // artifacts kept on disk at most
  absl::Duration keep_recent = absl::Seconds(60);  // never evicted within this of a use
  // Where compiles are written before they are stored, and artifacts the cache directory
  // cannot take are kept; empty: the cache directory itself, which must then be writable.
  std::filesystem::path scratch_dir;
};

// A directory of this process's own (mode 0700) under the system's temporary directory,
// PREFIX-PID-XXXXXX, removed with everything in it when the object goes: a CompileCache's
// scratch directory. Those of this user's processes that have ended without removing
// theirs (killed) are removed when a new one is made.
class ScratchDirectory {
 public:
  // INTERNAL when the directory cannot be made.
  static absl::StatusOr<std::unique_ptr<ScratchDirectory>> Make(absl::string_view prefix);
  ~ScratchDirectory();
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit ScratchDirectory(std::filesystem::path path) : path_(std::move(path)) {}
  static void RemoveOrphans(const std::filesystem::path& temp, absl::string_view prefix);
  const std::filesystem::path path_;
};

struct CompileCacheStats {
  size_t artifacts = 0;
  uint64_t bytes = 0;
  uint64_t evictions = 0;
};

class CompileCache {
 public:
  // Creates `dir` (mode 0700) if needed and indexes the artifacts in it. Temporary files
  // older than an hour, left by a crashed compile, are removed; past the bound, the least
  // recently used artifacts are.
  static absl::StatusOr<std::unique_ptr<CompileCache>> Open(const std::filesystem::path& dir,
                                                            CompileCacheOptions options = {});

  // The artifact for `source` on `device`, compiling it on a miss. Compile errors are
  // returned as the device reports them; nothing is cached for them.
  absl::StatusOr<CompiledArtifact> GetOrCompile(Device& device, const ProgramSource& source);

  // Removes the artifact under `key` (one that failed to load), so the next
  // GetOrCompile compiles it again.
  void Invalidate(const std::string& key);

  const std::filesystem::path& dir() const { return dir_; }
  CompileCacheStats stats() const;

 private:
  struct Entry {
    uint64_t bytes = 0;
    std::filesystem::file_time_type last_use;
  };
  CompileCache(std::filesystem::path dir, CompileCacheOptions options)
      : dir_(std::move(dir)), options_(options) {}
  std::shared_ptr<absl::Mutex> KeyLock(const std::string& key);
  // Records a use of the artifact `key` of `bytes` (its file's time set to now).
  void Touch(const std::string& key, const std::filesystem::path& path, uint64_t bytes);
  // Removes least recently used artifacts, not used within keep_recent, until the cache
  // is within max_bytes.
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the compiled `temp` to `artifact.path`; when the cache directory cannot take it,
  // keeps it in the scratch directory and points `artifact.path` there.
  absl::Status Store(const std::filesystem::path& temp, CompiledArtifact& artifact);
  // A temporary name in `dir` for the artifact `key`.
  std::filesystem::path TempPath(const std::filesystem::path& dir, const std::string& key);

  const std::filesystem::path dir_;
  const CompileCacheOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::weak_ptr<absl::Mutex>> key_locks_ ABSL_GUARDED_BY(mu_);
  uint64_t temp_counter_ ABSL_GUARDED_BY(mu_) = 0;
  // Artifacts kept in the scratch directory by key, and whether the last store failed
  // (what the log has said).
  absl::flat_hash_map<std::string, std::filesystem::path> unstored_ ABSL_GUARDED_BY(mu_);
  bool store_failing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace replayd

#endif  // REPLAYD_ENGINE_COMPILE_CACHE_H_
