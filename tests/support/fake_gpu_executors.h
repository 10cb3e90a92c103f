// A daemon on loopback whose GPU device (a fake's: tests/support/fake_cuda, fake_hip) is
// served through executors, with three tenants, research, prod and ops (tokens
// "<name>-token"): what the fake CUDA and HIP executor tests share. A tenant's executor
// holds vendor state of its own (a CUDA context, the HIP runtime's), counted against the
// device at kExecutorBytes of the fake's 1 GiB.
#ifndef REPLAYD_TESTS_SUPPORT_FAKE_GPU_EXECUTORS_H_
#define REPLAYD_TESTS_SUPPORT_FAKE_GPU_EXECUTORS_H_

#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"
#include "tests/support/copy_graphs.h"
#include "tests/support/status_macros.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {

class FakeGpuExecutorFixture : public DaemonFixture {
 protected:
  static constexpr uint64_t kExecutorBytes = 400 << 20;
  static constexpr int64_t kFloats = 256;

  // Starts the daemon with `device` ("cuda:0", "hip:0") through executors; `adjust` names
  // the device kind and sets what its executors hold of their own to kExecutorBytes.
  void StartDaemon(std::string device, const std::function<void(DaemonOptions&)>& adjust) {
    device_ = std::move(device);
    adjust_ = adjust;
    const std::filesystem::path file = cache_.path() / "tenants.textproto";
    std::ofstream(file) << TenantText("research", "research-token", "") << TenantText("prod", "prod-token", "")
                        << TenantText("ops", "ops-token", "");
    Options options;
    options.tenants_file = file;
    options.adjust = [adjust](DaemonOptions& d) {
      d.tenant_defaults.isolation = Isolation::kProcess;
      adjust(d);
    };
    Start(options);
  }

  Client As(const std::string& token) {
    ClientOptions o;
    o.token = token;
    return Client::Connect(daemon_->address(), o);
  }

  // The device's free memory as `c` sees it listed.
  uint64_t FreeMemory(Client& c) {
    absl::StatusOr<std::vector<v1::Device>> devices = c.ListDevices();
    EXPECT_TRUE(devices.ok()) << devices.status();
    for (const v1::Device& d : devices.ok() ? *devices : std::vector<v1::Device>())
      if (d.id() == device_) return d.free_memory();
    ADD_FAILURE() << device_ << " is not listed";
    return 0;
  }

  // Writes kFloats floats from `seed` to a buffer of `s`, copies them on the device to
  // another and reads them back: what a tenant whose executor works sees.
  void ExpectCopiesRight(Session& s, float seed) {
    using replayd::testing::copy_graphs::Iota;
    ASSERT_OK_AND_ASSIGN(Buffer in, s.Alloc(kFloats * 4));
    ASSERT_OK_AND_ASSIGN(Buffer out, s.Alloc(kFloats * 4));
    ASSERT_TRUE(s.WriteVector(in, Iota(kFloats, seed)).ok());
    ASSERT_TRUE(s.Copy(View{&out}, View{&in}).ok());
    ASSERT_OK_AND_ASSIGN(std::vector<float> got, s.ReadVector<float>(out, kFloats));
    EXPECT_EQ(got, Iota(kFloats, seed));
  }

  // A tenant's executor's own state is counted while it runs: one executor per tenant,
  // past what the device has a tenant's first session is refused, and (without a linger)
  // an executor that ends with its tenant's last session gives its share back.
  void CheckAnExecutorsOwnStateIsCounted() {
    RestartWithLinger(absl::ZeroDuration());
    Client research = As("research-token"), prod = As("prod-token"), ops = As("ops-token");
    const uint64_t total = FreeMemory(research);
    ASSERT_EQ(total, uint64_t{1} << 30);
    ASSERT_OK_AND_ASSIGN(Session mine, research.OpenSession(device_));
    EXPECT_EQ(FreeMemory(research), total - kExecutorBytes);
    ASSERT_OK_AND_ASSIGN(Session mine_too, research.OpenSession(device_));
    EXPECT_EQ(FreeMemory(research), total - kExecutorBytes) << "one executor per tenant";
    ASSERT_OK_AND_ASSIGN(Session theirs, prod.OpenSession(device_));
    EXPECT_EQ(FreeMemory(research), total - 2 * kExecutorBytes);
    absl::StatusOr<Session> refused = ops.OpenSession(device_);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("an executor for tenant ops needs"));
    ExpectCopiesRight(theirs, 1);
    // research's last session closes: its executor ends, and ops's fits.
    EXPECT_TRUE(mine_too.Close().ok());
    EXPECT_EQ(FreeMemory(research), total - 2 * kExecutorBytes) << "a session of research is still open";
    EXPECT_TRUE(mine.Close().ok());
    EXPECT_EQ(FreeMemory(research), total - kExecutorBytes);
    ASSERT_OK_AND_ASSIGN(Session ours, ops.OpenSession(device_));
    ExpectCopiesRight(ours, 2);
  }

  // With a linger, an idle executor's own state stays counted only until another
  // tenant's executor needs the room: then the idle one ends, and the newcomer's session
  // works; with no idle executor left, a tenant's first session is refused as before.
  void CheckAnIdleExecutorGivesWayToAnotherTenantsExecutor() {
    RestartWithLinger(absl::Hours(1));
    Client research = As("research-token"), prod = As("prod-token"), ops = As("ops-token");
    const uint64_t total = FreeMemory(research);
    {
      ASSERT_OK_AND_ASSIGN(Session mine, research.OpenSession(device_));
      ExpectCopiesRight(mine, 1);
      EXPECT_TRUE(mine.Close().ok());
    }
    EXPECT_EQ(FreeMemory(research), total - kExecutorBytes) << "research's executor lingers";
    ASSERT_OK_AND_ASSIGN(Session theirs, prod.OpenSession(device_));
    EXPECT_EQ(FreeMemory(research), total - 2 * kExecutorBytes);
    ASSERT_OK_AND_ASSIGN(Session ours, ops.OpenSession(device_));
    EXPECT_EQ(FreeMemory(research), total - 2 * kExecutorBytes) << "research's idle executor gave way";
    ExpectCopiesRight(ours, 2);
    ExpectCopiesRight(theirs, 3);
    absl::StatusOr<Session> refused = research.OpenSession(device_);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::HasSubstr("an executor for tenant research needs"));
  }

  // Starts the daemon again, as it was, with executors that linger for `linger`.
  void RestartWithLinger(absl::Duration linger) {
    const std::function<void(DaemonOptions&)> adjust = adjust_;
    StartDaemon(device_, [adjust, linger](DaemonOptions& d) {
      adjust(d);
      d.executor_linger = linger;
    });
  }

  std::string device_;
  std::function<void(DaemonOptions&)> adjust_;
};

}  // namespace replayd::client

#endif  // REPLAYD_TESTS_SUPPORT_FAKE_GPU_EXECUTORS_H_
