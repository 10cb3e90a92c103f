// A real replayd daemon on an ephemeral loopback port, with its own compile cache, for
// tests that talk to it over gRPC as clients do.
#ifndef REPLAYD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_
#define REPLAYD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>

#include "client/client.h"
#include "server/daemon.h"
#include "tests/support/temp_dir.h"

namespace replayd::client {

// out[i] = in[i] * 2 + k over n floats, in one invocation.
inline constexpr char kAffineSource[] = R"(
void affine(float *out, const float *in, int n, int k) {
  for (int i = 0; i < n; ++i) out[i] = in[i] * 2.0f + (float)k;
})";

// out = a + b over n floats, split into `cores` parts, one per invocation.
inline constexpr char kAddSource[] = R"(
void add(float *out, const float *a, const float *b, int n, int cores, int core) {
  int chunk = (n + cores - 1) / cores;
  int lo = core * chunk, hi = lo + chunk < n ? lo + chunk : n;
  for (int i = lo; i < hi; ++i) out[i] = a[i] + b[i];
}
)";

class DaemonFixture : public ::testing::Test {
 protected:
  struct Options {
    absl::Duration lease = absl::Seconds(60);
    uint64_t memory_limit = 256 << 20;
    size_t graph_cache_graphs = 256;
    uint64_t graph_cache_bytes = uint64_t{1} << 30;
    size_t stream_window = 8;
    std::filesystem::path tenants_file = {};
    // Anything else, applied last.
    std::function<void(DaemonOptions&)> adjust = nullptr;
  };

  void SetUp() override { Start(Options()); }

  void Start(Options options) {
    daemon_.reset();
    DaemonOptions d;
    d.listen = "127.0.0.1:0";
    d.engine.cache_dir = cache_.path();
    d.engine.lease = options.lease;
    d.cpu.memory_limit = options.memory_limit;
    d.engine.graph_cache.max_graphs = options.graph_cache_graphs;
    d.engine.graph_cache.max_bytes = options.graph_cache_bytes;
    d.streams.window = options.stream_window;
    d.tenants_file = options.tenants_file;
    // Each tenant's work runs in executors (the default); the whole suite runs a second
    // time in the daemon's process (ctest's shared.* entries set this).
    d.executor_binary = REPLAYD_EXECUTOR_BINARY;
    d.cpu.compiler.cage = REPLAYD_CC_BINARY;  // every cpu-c compile in replayd-cc, as replayd does
    // Binaries moved from where they were built (tests/gpu/pack.sh) say where they are.
    if (const char* bin = std::getenv("REPLAYD_TEST_BIN_DIR")) {
      d.executor_binary = std::filesystem::path(bin) / "replayd-executor";
      d.cpu.compiler.cage = std::filesystem::path(bin) / "replayd-cc";
    }
    if (const char* isolation = std::getenv("REPLAYD_TEST_ISOLATION"); isolation && std::string(isolation) == "shared")
      d.tenant_defaults.isolation = Isolation::kShared;
    if (options.adjust) options.adjust(d);
    isolation_ = d.tenant_defaults.isolation;
    auto started = Daemon::Start(d);
    ASSERT_TRUE(started.ok()) << started.status();
    daemon_ = std::move(*started);
    client_ = std::make_unique<Client>(Client::Connect(daemon_->address()));
  }

  Client& client() { return *client_; }
  v1::Replayd::Stub& stub() { return client_->stub(); }

  // The free memory ListDevices reports for `device`; 0 (and a failure) when it is not listed.
  uint64_t FreeMemory(const std::string& device = "cpu:0") {
    auto devices = client_->ListDevices();
    EXPECT_TRUE(devices.ok()) << devices.status();
    for (const v1::Device& d : devices.ok() ? *devices : std::vector<v1::Device>())
      if (d.id() == device) return d.free_memory();
    ADD_FAILURE() << device << " is not listed";
    return 0;
  }

  Session Open() {
    auto s = client_->OpenSession("cpu:0");
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }

  static ProgramSpec AddSpec() {
    ProgramSpec spec;
    spec.code = kAddSource;
    spec.entry = "add";
    spec.signature = *ParseSignature("out,in,in,int32,int32", /*core_id=*/true);
    return spec;
  }

  TempDir cache_;
  Isolation isolation_ = Isolation::kProcess;  // the tenants' default in the daemon started last
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

}  // namespace replayd::client

#endif  // REPLAYD_TESTS_INTEGRATION_DAEMON_FIXTURE_H_
