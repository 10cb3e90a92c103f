#include "engine/compile_cache.h"

#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace replayd {
namespace {

constexpr absl::string_view kTempPrefix = ".tmp-";
constexpr absl::string_view kArtifactSuffix = ".artifact";

// Feeds one length-prefixed field, so that no two different field lists hash alike.
void Feed(EVP_MD_CTX* ctx, absl::string_view field) {
  uint64_t n = field.size();
  EVP_DigestUpdate(ctx, &n, sizeof n);
  EVP_DigestUpdate(ctx, field.data(), field.size());
}

std::string SignatureText(const Signature& s) {
  std::string text = s.core_id ? "core_id;" : ";";
  for (const auto& p : s.params)
    absl::StrAppend(&text, static_cast<int>(p.kind), ":", static_cast<int>(p.access), ",");
  return text;
}

}  // namespace

std::string CompileKey(const ProgramSource& source, absl::string_view target) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  Feed(ctx, "replayd-compile-v1");
  Feed(ctx, source.format);
  Feed(ctx, target);
  Feed(ctx, source.code);
  Feed(ctx, source.entry);
  Feed(ctx, SignatureText(source.signature));
  for (const auto& option : source.options) Feed(ctx, option);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), len));
}

absl::StatusOr<std::unique_ptr<CompileCache>> CompileCache::Open(const std::filesystem::path& dir,
                                                                  CompileCacheOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return absl::InternalError(absl::StrCat(dir.string(), " is not a directory"));
  // Artifacts are loaded as native code: refuse a cache others can write to.
  if (st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    if (st.st_uid != geteuid() || chmod(dir.c_str(), 0700) != 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "compile cache ", dir.string(), " must be owned by this user and not writable by others"));
  }
  std::unique_ptr<CompileCache> cache(new CompileCache(dir, options));
  auto now = std::filesystem::file_time_type::clock::now();
  {
    absl::MutexLock lock(&cache->mu_);
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      std::error_code ignored;
      auto written = entry.last_write_time(ignored);
      if (absl::StartsWith(name, kTempPrefix)) {
        // A partial artifact, or a compile's work directory, left by a daemon that was killed.
        if (!ignored && now - written > std::chrono::hours(1)) std::filesystem::remove_all(entry.path(), ignored);
        continue;
      }
      if (!absl::EndsWith(name, kArtifactSuffix) || !entry.is_regular_file(ignored)) continue;
      const uint64_t bytes = entry.file_size(ignored);
      cache->entries_[name.substr(0, name.size() - kArtifactSuffix.size())] = {bytes, written};
      cache->bytes_ += bytes;
    }
    cache->Evict();
  }
  return cache;
}

CompileCacheStats CompileCache::stats() const {
  absl::MutexLock lock(&mu_);
  return {entries_.size(), bytes_, evictions_};
}

void CompileCache::Touch(const std::string& key, const std::filesystem::path& path, uint64_t bytes) {
  const auto now = std::filesystem::file_time_type::clock::now();
  std::error_code ignored;
  std::filesystem::last_write_time(path, now, ignored);  // the order of use survives a restart
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = entries_.try_emplace(key, Entry{bytes, now});
  if (!inserted) {
    bytes_ -= it->second.bytes;
    it->second = {bytes, now};
  }
  bytes_ += bytes;
  Evict();
}

void CompileCache::Evict() {
  const auto recent = std::filesystem::file_time_type::clock::now() -
                      std::chrono::duration_cast<std::filesystem::file_time_type::duration>(
                          absl::ToChronoNanoseconds(options_.keep_recent));
  while (bytes_ > options_.max_bytes) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.last_use < recent && (oldest == entries_.end() || it->second.last_use < oldest->second.last_use))
        oldest = it;
    if (oldest == entries_.end()) return;  // every artifact in recent use: over the bound for now
    std::error_code ignored;
    std::filesystem::remove(dir_ / absl::StrCat(oldest->first, kArtifactSuffix), ignored);
    bytes_ -= oldest->second.bytes;
    entries_.erase(oldest);
    ++evictions_;
  }
}

std::shared_ptr<absl::Mutex> CompileCache::KeyLock(const std::string& key) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<absl::Mutex> m = key_locks_[key].lock();
  if (!m) {
    m = std::make_shared<absl::Mutex>();
    key_locks_[key] = m;
  }
  // Drop entries whose compiles have all finished, so the map stays small.
  if (key_locks_.size() > 64) absl::erase_if(key_locks_, [](const auto& kv) { return kv.second.expired(); });
  return m;
}

absl::StatusOr<CompiledArtifact> CompileCache::GetOrCompile(Device& device,
                                                            const ProgramSource& source) {
  CompiledArtifact artifact;
  artifact.key = CompileKey(source, device.info().target);
  artifact.path = dir_ / absl::StrCat(artifact.key, kArtifactSuffix);
  std::shared_ptr<absl::Mutex> key_lock = KeyLock(artifact.key);
  absl::MutexLock lock(key_lock.get());
  std::error_code ec;
  if (std::filesystem::is_regular_file(artifact.path, ec)) {
    artifact.cache_hit = true;
    const uint64_t bytes = std::filesystem::file_size(artifact.path, ec);
    Touch(artifact.key, artifact.path, ec ? 0 : bytes);
    return artifact;
  }
  {
    absl::MutexLock l(&mu_);
    if (auto it = unstored_.find(artifact.key); it != unstored_.end() && std::filesystem::is_regular_file(it->second, ec)) {
      artifact.cache_hit = true;
      artifact.path = it->second;
      return artifact;
    }
  }
  const std::filesystem::path temp = TempPath(options_.scratch_dir.empty() ? dir_ : options_.scratch_dir, artifact.key);
  auto start = std::chrono::steady_clock::now();
  absl::Status compiled = device.Compile(source, temp);
  artifact.compile_time = absl::FromChrono(std::chrono::steady_clock::now() - start);
  if (!compiled.ok()) {
    std::filesystem::remove(temp, ec);
    return compiled;
  }
  if (absl::Status s = Store(temp, artifact); !s.ok()) return s;
  return artifact;
}

std::filesystem::path CompileCache::TempPath(const std::filesystem::path& dir, const std::string& key) {
  absl::MutexLock l(&mu_);
  return dir / absl::StrCat(kTempPrefix, key, "-", getpid(), "-", temp_counter_++);
}

absl::Status CompileCache::Store(const std::filesystem::path& temp, CompiledArtifact& artifact) {
  std::error_code ec;
  std::filesystem::rename(temp, artifact.path, ec);
  if (ec == std::errc::cross_device_link) {
    // The scratch directory is on another file system: a copy beside the artifact, renamed.
    const std::filesystem::path copy = TempPath(dir_, artifact.key);
    std::filesystem::copy_file(temp, copy, ec);
    if (!ec) std::filesystem::rename(copy, artifact.path, ec);
    std::error_code ignored;
    if (ec) std::filesystem::remove(copy, ignored);
    if (!ec) std::filesystem::remove(temp, ignored);
  }
  if (!ec) {
    const uint64_t bytes = std::filesystem::file_size(artifact.path, ec);
    Touch(artifact.key, artifact.path, ec ? 0 : bytes);
    absl::MutexLock lock(&mu_);
    if (std::exchange(store_failing_, false)) spdlog::info("compile cache {} stores artifacts again", dir_.string());
    return absl::OkStatus();
  }
  std::error_code ignored;
  if (options_.scratch_dir.empty()) {
    std::filesystem::remove(temp, ignored);
    return absl::InternalError(absl::StrCat("cannot store artifact ", artifact.path.string(), ": ", ec.message()));
  }
  const std::filesystem::path kept = options_.scratch_dir / absl::StrCat(artifact.key, kArtifactSuffix);
  std::filesystem::rename(temp, kept, ignored);
  if (ignored) {
    std::filesystem::remove(temp, ignored);
    return absl::InternalError(absl::StrCat("cannot keep artifact ", kept.string(), ": ", ignored.message()));
  }
  artifact.path = kept;
  absl::MutexLock lock(&mu_);
  unstored_[artifact.key] = kept;
  if (!std::exchange(store_failing_, true))
    spdlog::warn("compile cache {} cannot store artifacts ({}): compiled programs are kept in {} until the daemon "
                 "stops and compiled again after a restart",
                 dir_.string(), ec.message(), options_.scratch_dir.string());
  return absl::OkStatus();
}

void CompileCache::Invalidate(const std::string& key) {
  std::error_code ec;
  std::filesystem::remove(dir_ / absl::StrCat(key, kArtifactSuffix), ec);
  absl::MutexLock lock(&mu_);
  if (auto it = unstored_.find(key); it != unstored_.end()) {
    std::filesystem::remove(it->second, ec);
    unstored_.erase(it);
  }
  if (auto it = entries_.find(key); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
}

absl::StatusOr<std::unique_ptr<ScratchDirectory>> ScratchDirectory::Make(absl::string_view prefix) {
  std::error_code ec;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(ec);
  if (ec) return absl::InternalError(absl::StrCat("no temporary directory: ", ec.message()));
  RemoveOrphans(temp, prefix);
  std::string pattern = (temp / absl::StrCat(prefix, "-", getpid(), "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr)
    return absl::InternalError(absl::StrCat("cannot make a directory ", pattern, ": ", std::strerror(errno)));
  return std::unique_ptr<ScratchDirectory>(new ScratchDirectory(pattern));
}

void ScratchDirectory::RemoveOrphans(const std::filesystem::path& temp, absl::string_view prefix) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(temp, ec)) {
    const std::string filename = entry.path().filename().string();
    absl::string_view name = filename;
    if (!absl::ConsumePrefix(&name, absl::StrCat(prefix, "-"))) continue;
    pid_t pid = 0;
    struct stat st;
    if (!absl::SimpleAtoi(name.substr(0, name.find('-')), &pid) || pid <= 0) continue;
    if (lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;  // its process is alive (or not ours to ask)
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

ScratchDirectory::~ScratchDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace replayd
