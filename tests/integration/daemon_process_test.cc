// The replayd binary itself: SIGHUP reloads the tenants file, SIGTERM shuts down
// cleanly, without a tenants file it refuses a non-loopback address, and a device kind
// the machine lacks is said once in the log.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "server/daemon.h"
#include "tests/support/child_process.h"
#include "tests/support/free_port.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tenants_file.h"

namespace replayd::client {
namespace {

absl::Status OpenAndClose(const std::string& address, const std::string& token) {
  ClientOptions o;
  o.token = token;
  Client c = Client::Connect(address, o);
  return c.OpenSession("cpu:0").status();
}

TEST(DaemonProcessTest, SighupReloadsTheTenantsAndSigtermStops) {
  TempDir dir;
  const auto file = dir.path() / "tenants.textproto";
  auto write = [&](const std::string& token) {
    std::ofstream(file, std::ios::trunc) << "tenant { name: \"alice\" token_sha256: \"" << Sha256Hex(token)
                                         << "\" trusted: true }\n";
  };
  write("first");
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  pid_t pid = Spawn({REPLAYD_BINARY, "--listen=" + address, "--tenants=" + file.string(),
                     "--cache_dir=" + (dir.path() / "cache").string(), "--log_level=warn"});
  ASSERT_GT(pid, 0);
  absl::Status up;
  for (int i = 0; i < 100; ++i) {
    up = OpenAndClose(address, "first");
    if (up.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(up.ok()) << up;
  write("second");
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  absl::Status old_token;
  for (int i = 0; i < 100; ++i) {
    old_token = OpenAndClose(address, "first");
    if (!old_token.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(old_token.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(OpenAndClose(address, "second").ok());
  // A broken file on SIGHUP leaves the policy in force.
  std::ofstream(file, std::ios::trunc) << "tenant {";
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(OpenAndClose(address, "second").ok());
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(pid), 0);
}

TEST(DaemonProcessTest, WithoutTenantsANonLoopbackAddressIsRefused) {
  TempDir dir;
  pid_t pid = Spawn({REPLAYD_BINARY, "--listen=0.0.0.0:0", "--cache_dir=" + dir.path().string(), "--log_level=error"});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid), 2);
}

// Every kind this build knows is started by default; one without hardware or vendor
// library serves no devices and says why in one log line.
TEST(DaemonProcessTest, AKindWithoutDevicesSaysWhyOnceAndTheRestServe) {
  TempDir dir;
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const auto log = dir.path() / "log";
  pid_t pid = Spawn({REPLAYD_BINARY, "--listen=" + address, "--cache_dir=" + (dir.path() / "cache").string()}, log);
  ASSERT_GT(pid, 0);
  absl::StatusOr<std::vector<v1::Device>> devices;
  for (int i = 0; i < 100; ++i) {
    devices = Client::Connect(address).ListDevices();
    if (devices.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(pid), 0);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  for (absl::string_view kind : absl::StrSplit(kKnownDeviceKinds, ',')) {
    int served = 0;
    for (const v1::Device& d : *devices) served += d.kind() == kind;
    int said = 0;
    for (absl::string_view line : absl::StrSplit(text.str(), '\n'))
      said += absl::StrContains(line, absl::StrCat(kind, ": no devices: "));
    EXPECT_EQ(said, served == 0 ? 1 : 0) << kind << "\n" << text.str();
  }
  EXPECT_TRUE(absl::StrContains(text.str(), "device cpu:0")) << text.str();
}

// A daemon whose session runs a cpu-c kernel that never returns still stops: SIGTERM drains
// for --drain_seconds, then the daemon exits without waiting on the endless one (exit 1,
// saying why); a second SIGTERM exits at once (exit 0).
class EndlessKernelTest : public ::testing::TestWithParam<bool> {};

TEST_P(EndlessKernelTest, SigtermStopsTheDaemon) {
  const bool twice = GetParam();
  TempDir dir;
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const auto log = dir.path() / "log";
  pid_t pid = Spawn({REPLAYD_BINARY, "--listen=" + address, "--cache_dir=" + (dir.path() / "cache").string(),
                     "--drain_seconds=1", "--devices=cpu"},
                    log);
  ASSERT_GT(pid, 0);
  Client c = Client::Connect(address);
  absl::StatusOr<Session> session = absl::UnavailableError("not yet");
  for (int i = 0; i < 100 && !session.ok(); ++i) {
    session = c.OpenSession("cpu:0");
    if (!session.ok()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(session.ok()) << session.status();
  auto program = session->Load({"cpu-c", "void endless(int *x) { for (;;) __atomic_store_n(x, 1, 0); }", "endless",
                                *ParseSignature("inout"), {}});
  auto x = session->Alloc(64);
  ASSERT_TRUE(program.ok() && x.ok()) << program.status() << x.status();
  std::thread launch([&] {
    session->Launch(*program, {View{&*x}}, {1, 1, 1}, {1, 1, 1}, true).status().IgnoreError();
  });
  absl::SleepFor(absl::Milliseconds(500));  // the kernel runs by then
  const absl::Time start = absl::Now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  if (twice) {
    absl::SleepFor(absl::Milliseconds(300));
    ASSERT_EQ(kill(pid, SIGTERM), 0);
  }
  const int code = WaitExit(pid);
  const absl::Duration took = absl::Now() - start;
  launch.join();  // its call fails once the daemon is gone
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  if (twice) {
    EXPECT_EQ(code, 0) << text.str();
    EXPECT_TRUE(absl::StrContains(text.str(), "again: exiting at once")) << text.str();
  } else {
    EXPECT_EQ(code, 1) << text.str();
    EXPECT_TRUE(absl::StrContains(text.str(), "exiting without waiting for it")) << text.str();
  }
  EXPECT_LT(took, absl::Seconds(30)) << "the daemon did not stop by itself";
}

INSTANTIATE_TEST_SUITE_P(Signals, EndlessKernelTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Twice" : "Once"; });

}  // namespace
}  // namespace replayd::client
