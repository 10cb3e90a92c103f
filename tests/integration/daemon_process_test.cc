// The replayd binary itself: SIGHUP reloads the tenants file, SIGTERM shuts down
// cleanly, and without a tenants file it refuses a non-loopback address.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/support/free_port.h"
#include "tests/support/temp_dir.h"
#include "tests/support/tenants_file.h"

extern char** environ;

namespace replayd::client {
namespace {

pid_t Spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ);
  return pid;
}

int WaitExit(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}


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
  pid_t pid = Spawn({REPLAYD_BINARY, "--listen=0.0.0.0:0", "--cache_dir=" + dir.path().string(),
                     "--log_level=error"});
  ASSERT_GT(pid, 0);
  EXPECT_EQ(WaitExit(pid), 2);
}

}  // namespace
}  // namespace replayd::client
