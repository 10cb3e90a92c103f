#include "engine/compile_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "tests/support/temp_dir.h"

namespace replayd {
namespace {

// A device that "compiles" by writing the source code to the output, counting calls.
class CountingDevice : public Device {
 public:
  CountingDevice() { info_.id = "fake:0"; info_.target = "fake-target"; }
  const DeviceInfo& info() const override { return info_; }
  uint64_t memory_in_use() const override { return 0; }
  DeviceMemory& memory() override { return memory_; }
  absl::Status Compile(const ProgramSource& source, const std::filesystem::path& out) override {
    ++compiles;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (source.code == "broken") return absl::InvalidArgumentError("program.c:1: error");
    std::ofstream(out) << source.code;
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Context>> OpenContext(const ContextOptions&) override {
    return absl::UnimplementedError("not needed");
  }
  std::atomic<int> compiles{0};
  DeviceInfo info_;
  DeviceMemory memory_{0};
};

ProgramSource Source(std::string code = "void k(void) {}") {
  ProgramSource s;
  s.format = "cpu-c";
  s.code = std::move(code);
  s.entry = "k";
  return s;
}

TEST(CompileKeyTest, IsSha256HexAndStable) {
  std::string key = CompileKey(Source(), "t");
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(key, CompileKey(Source(), "t"));
}

TEST(CompileKeyTest, ChangesWithEveryInput) {
  const std::string base = CompileKey(Source(), "t");
  ProgramSource s = Source();
  EXPECT_NE(CompileKey(s, "t2"), base);
  s.format = "cuda-c";
  EXPECT_NE(CompileKey(s, "t"), base);
  s = Source("void k(void) { }");
  EXPECT_NE(CompileKey(s, "t"), base);
  s = Source();
  s.entry = "k2";
  EXPECT_NE(CompileKey(s, "t"), base);
  s = Source();
  s.options = {"-O3"};
  EXPECT_NE(CompileKey(s, "t"), base);
  s = Source();
  s.signature.params.push_back({"", ParamKind::kInt32, Access::kNone});
  EXPECT_NE(CompileKey(s, "t"), base);
  s = Source();
  s.signature.core_id = true;
  EXPECT_NE(CompileKey(s, "t"), base);
}

TEST(CompileKeyTest, FieldBoundariesMatter) {
  ProgramSource a = Source("ab");
  a.entry = "c";
  ProgramSource b = Source("a");
  b.entry = "bc";
  EXPECT_NE(CompileKey(a, "t"), CompileKey(b, "t"));
  ProgramSource c = Source();
  c.options = {"-DA", "-DB"};
  ProgramSource d = Source();
  d.options = {"-DA-DB"};
  EXPECT_NE(CompileKey(c, "t"), CompileKey(d, "t"));
}

TEST(CompileCacheTest, SecondRequestHitsWithoutCompiling) {
  TempDir dir;
  auto cache = CompileCache::Open(dir.path());
  ASSERT_TRUE(cache.ok()) << cache.status();
  CountingDevice device;
  auto first = (*cache)->GetOrCompile(device, Source());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->cache_hit);
  EXPECT_GT(first->compile_time, absl::ZeroDuration());
  auto second = (*cache)->GetOrCompile(device, Source());
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->cache_hit);
  EXPECT_EQ(second->path, first->path);
  EXPECT_EQ(device.compiles, 1);
}

TEST(CompileCacheTest, ARestartedCacheReusesArtifactsOnDisk) {
  TempDir dir;
  CountingDevice device;
  {
    auto cache = CompileCache::Open(dir.path());
    ASSERT_TRUE((*cache)->GetOrCompile(device, Source()).ok());
  }
  auto reopened = CompileCache::Open(dir.path());
  auto again = (*reopened)->GetOrCompile(device, Source());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->cache_hit);
  EXPECT_EQ(device.compiles, 1);
}

TEST(CompileCacheTest, ConcurrentRequestsForOneKeyCompileOnce) {
  TempDir dir;
  auto cache = CompileCache::Open(dir.path());
  CountingDevice device;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] { ok += (*cache)->GetOrCompile(device, Source()).ok(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok, 8);
  EXPECT_EQ(device.compiles, 1);
}

TEST(CompileCacheTest, CompileErrorsAreReturnedAndNotCached) {
  TempDir dir;
  auto cache = CompileCache::Open(dir.path());
  CountingDevice device;
  auto r = (*cache)->GetOrCompile(device, Source("broken"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("program.c:1"), absl::string_view::npos);
  EXPECT_FALSE((*cache)->GetOrCompile(device, Source("broken")).ok());
  EXPECT_EQ(device.compiles, 2);
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) files += (void(e), 1);
  EXPECT_EQ(files, 0) << "a failed compile left a file behind";
}

TEST(CompileCacheTest, StaleTemporaryFilesAreRemovedAndFreshOnesKept) {
  TempDir dir;
  auto stale = dir.path() / ".tmp-abc-1-0";
  auto fresh = dir.path() / ".tmp-def-1-0";
  auto stale_work = dir.path() / ".tmp-ghi-1-0.cc-Xy12Zq";  // a compile's work directory
  std::ofstream(stale) << "partial";
  std::ofstream(fresh) << "partial";
  std::filesystem::create_directory(stale_work);
  std::ofstream(stale_work / "program.c") << "void f(void) {}";
  for (const auto& old : {stale, stale_work})
    std::filesystem::last_write_time(old, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
  ASSERT_TRUE(CompileCache::Open(dir.path()).ok());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(stale_work));
  EXPECT_TRUE(std::filesystem::exists(fresh)) << "may belong to a compile in progress";
}

TEST(CompileCacheTest, InvalidateForcesARecompile) {
  TempDir dir;
  auto cache = CompileCache::Open(dir.path());
  CountingDevice device;
  auto first = (*cache)->GetOrCompile(device, Source());
  (*cache)->Invalidate(first->key);
  auto second = (*cache)->GetOrCompile(device, Source());
  EXPECT_FALSE(second->cache_hit);
  EXPECT_EQ(device.compiles, 2);
}

TEST(CompileCacheTest, TightensAWorldWritableDirectory) {
  TempDir dir;
  chmod(dir.path().c_str(), 0777);
  ASSERT_TRUE(CompileCache::Open(dir.path()).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u);
}

// A source whose artifact (the fake device writes the code) is `bytes` long.
ProgramSource SourceOfBytes(char tag, size_t bytes) { return Source(std::string(bytes, tag)); }

bool Stored(const CompileCache& cache, const ProgramSource& s) {
  return std::filesystem::exists(cache.dir() / (CompileKey(s, "fake-target") + ".artifact"));
}

TEST(CompileCacheTest, IsBoundedByBytesAndEvictsTheLeastRecentlyUsed) {
  TempDir dir;
  CountingDevice device;
  auto cache = CompileCache::Open(dir.path(), {/*max_bytes=*/3000, /*keep_recent=*/absl::ZeroDuration(), /*scratch_dir=*/{}});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const ProgramSource a = SourceOfBytes('a', 1000), b = SourceOfBytes('b', 1000), c = SourceOfBytes('c', 1000),
                      d = SourceOfBytes('d', 1000);
  for (const ProgramSource* s : {&a, &b, &c}) ASSERT_TRUE((*cache)->GetOrCompile(device, *s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto hit = (*cache)->GetOrCompile(device, a);  // a is now the most recently used
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->cache_hit);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE((*cache)->GetOrCompile(device, d).ok());
  EXPECT_FALSE(Stored(**cache, b)) << "the least recently used goes";
  for (const ProgramSource* s : {&a, &c, &d}) EXPECT_TRUE(Stored(**cache, *s));
  CompileCacheStats stats = (*cache)->stats();
  EXPECT_EQ(stats.artifacts, 3u);
  EXPECT_EQ(stats.bytes, 3000u);
  EXPECT_EQ(stats.evictions, 1u);
  const int compiles = device.compiles;
  auto again = (*cache)->GetOrCompile(device, b);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->cache_hit) << "an evicted artifact is compiled again";
  EXPECT_EQ(device.compiles, compiles + 1);
}

TEST(CompileCacheTest, ArtifactsInRecentUseStayPastTheBound) {
  TempDir dir;
  CountingDevice device;
  auto cache = CompileCache::Open(dir.path(), {/*max_bytes=*/1500, /*keep_recent=*/absl::Hours(1), /*scratch_dir=*/{}});
  ASSERT_TRUE(cache.ok()) << cache.status();
  for (char tag : {'a', 'b', 'c'}) ASSERT_TRUE((*cache)->GetOrCompile(device, SourceOfBytes(tag, 1000)).ok());
  EXPECT_EQ((*cache)->stats().evictions, 0u) << "a load right after its compile must find its file";
  EXPECT_EQ((*cache)->stats().bytes, 3000u);
}

TEST(CompileCacheTest, AReopenedCacheIndexesItsArtifactsAndKeepsTheBound) {
  TempDir dir;
  CountingDevice device;
  {
    auto cache = CompileCache::Open(dir.path());
    ASSERT_TRUE(cache.ok());
    for (char tag : {'a', 'b', 'c'}) {
      ASSERT_TRUE((*cache)->GetOrCompile(device, SourceOfBytes(tag, 1000)).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  auto reopened = CompileCache::Open(dir.path(), {/*max_bytes=*/1500, /*keep_recent=*/absl::ZeroDuration(), /*scratch_dir=*/{}});
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->stats().artifacts, 1u);
  EXPECT_EQ((*reopened)->stats().evictions, 2u);
  EXPECT_TRUE(Stored(**reopened, SourceOfBytes('c', 1000))) << "the most recently used stays";
}

// With a scratch directory, compiles are written there and stored in the cache; one the
// cache cannot take (here a directory stands where its file would go) stays in the
// scratch directory, loads from there, and is found there by the next GetOrCompile.
TEST(CompileCacheTest, StoresFromTheScratchDirectoryOrKeepsTheArtifactThere) {
  TempDir dir, scratch;
  CountingDevice device;
  auto cache = CompileCache::Open(dir.path() / "cache", {uint64_t{1} << 30, absl::Seconds(60), scratch.path()});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const ProgramSource stored = SourceOfBytes('s', 100), blocked = SourceOfBytes('b', 100);
  auto first = (*cache)->GetOrCompile(device, stored);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->path.parent_path(), dir.path() / "cache");
  EXPECT_TRUE(Stored(**cache, stored));
  EXPECT_TRUE(std::filesystem::is_empty(scratch.path()));

  std::filesystem::create_directories((*cache)->dir() / (CompileKey(blocked, "fake-target") + ".artifact") / "x");
  auto kept = (*cache)->GetOrCompile(device, blocked);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(kept->cache_hit);
  EXPECT_EQ(kept->path.parent_path(), scratch.path());
  std::ifstream file(kept->path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(file), {}), blocked.code);
  auto again = (*cache)->GetOrCompile(device, blocked);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cache_hit);
  EXPECT_EQ(again->path, kept->path);
  EXPECT_EQ(device.compiles, 2);
}

}  // namespace
}  // namespace replayd
